"""Hostile ResourceClaims and hostile DRA checkpoints, through the real daemon (in-process).

The daemon serves the fake backend as DRA driver ``fpga.example.com`` against the DRA kubelet
stand-in (real gRPC) and the API-server stand-in (HTTP, lightkube). Covers:

- claims whose allocation lies: results naming another driver or another node's pool (not ours:
  prepared with no devices), devices we do not have, the same device twice, 10,000 results, a
  device name and a request name of 1 MiB, a name that is not valid Unicode, configuration
  parameters nested 100 deep, of 1 MiB, or not a JSON object; all in one call with a good claim:
  each hostile claim gets its own error naming the claim and the field, at most 2,000
  characters; the good claim prepares; the daemon goes on serving; no log line carries a 1 MiB
  value (sizes, not contents);
- checkpoints that lie: truncated, not JSON, of the wrong types, a claim twice, a symlink in its
  place, a FIFO in its place (never opened blocking): the daemon starts and serves, the file is
  moved aside (or, for one bad claim, a copy kept) with the reason logged.

Bound: ~15 s in all.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from cdiplug.config import Config, parse_config
from cdiplug.models.world import World
from cdiplug.testing import ApiServerStandIn, DraKubeletStandIn
from cdiplug.testing.daemon import running_daemon
from cdiplug.testing.dra_kubelet import ClaimRef

from .conftest import figure

DRIVER = "fpga.example.com"
NODE = "node-h"
MIB = "x" * (1 << 20)


@pytest.fixture
def node_name() -> str:
    return NODE


@pytest.fixture
def config(short_tmp: Path) -> Config:
    options = {"count": 2, "prepared_dir": str(short_tmp / "prepared")}
    return parse_config(
        {"resources": [{"name": "example.com/fpga", "backend": "fake", "api": "dra", "options": options}]}, source="hostile"
    )


def result(device: str, request: str = "fpga", driver: str = DRIVER, pool: str = NODE) -> dict[str, str]:
    return {"request": request, "driver": driver, "pool": pool, "device": device}


def config_entry(parameters: Any) -> dict[str, Any]:
    return {"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": parameters}}


def deep(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(levels):
        value = {"a": value}
    return value


# name: (results, configs, what the error must name; None: prepared with no devices)
HOSTILE: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]], str | None]] = {
    "other-driver": ([result("fpga-0", driver="other.example.com")], [], None),
    "other-pool": ([result("fpga-0", pool="node-else")], [], None),
    "unknown-device": ([result("fpga-9")], [], "fpga-9"),
    "many-results": ([result("fpga-0", request=f"r{i}") for i in range(10_000)], [], "results"),
    "huge-device": ([result(MIB)], [], "results[0].device"),
    "huge-request": ([result("fpga-0", request=MIB)], [], "results[0].request"),
    "bad-unicode": ([result("fpga-\udcff")], [], "malformed"),  # refused as the client decodes it
    "deep-params": ([result("fpga-0")], [config_entry(deep(100))], "config[0].opaque.parameters"),
    "huge-params": ([result("fpga-0")], [config_entry({"v": MIB})], "config[0].opaque.parameters"),
    "params-not-json": ([result("fpga-0")], [config_entry("not json {")], "config[0].opaque.parameters"),
}


def put(api: ApiServerStandIn, n: int, name: str, results: list[dict[str, Any]], configs: list[dict[str, Any]]) -> ClaimRef:
    uid = f"{n:08x}-aaaa-4bbb-8ccc-dddddddddddd"
    devices: dict[str, Any] = {"results": results}
    if configs:
        devices["config"] = configs
    api.put_claim(
        {"metadata": {"name": name, "namespace": "default", "uid": uid}, "status": {"allocation": {"devices": devices}}}
    )
    return ClaimRef("default", name, uid)


async def test_hostile_claims_each_get_their_own_bounded_error(
    config: Config, dra_world: World, api: ApiServerStandIn, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    refs = {name: put(api, i + 1, name, res, cfg) for i, (name, (res, cfg, _)) in enumerate(HOSTILE.items())}
    twice = put(api, 100, "twice", [result("fpga-1", "a"), result("fpga-1", "b")], [])
    good = put(api, 101, "good", [result("fpga-0")], [])
    async with DraKubeletStandIn(dra_world.plugins_registry_dir) as kubelet, running_daemon(config, dra_world):
        conn = await asyncio.wait_for(kubelet.wait_registered(DRIVER), 10)
        answers = await conn.prepare([*refs.values(), twice, good])
        for name, (_, _, field) in HOSTILE.items():
            answer = answers[refs[name].uid]
            if field is None:
                assert not answer.error and answer.devices == (), (name, answer)
                continue
            assert answer.error, f"{name} prepared: {answer}"
            assert len(answer.error) <= 2000, f"{name}: an error of {len(answer.error):,} characters"
            assert name in answer.error and field in answer.error, (name, answer.error[:300])
        assert not answers[good.uid].error and answers[good.uid].devices[0].device == "fpga-0"
        assert [d.request_names for d in answers[twice.uid].devices] == [("a", "b")]  # one device, both requests
        assert await conn.unprepare([twice]) == {twice.uid: ""}
        # The daemon goes on: the good claim again (from the checkpoint), and a new one.
        again = put(api, 102, "later", [result("fpga-1")], [])
        later = await conn.prepare([good, again])
        assert not later[good.uid].error and not later[again.uid].error
        await conn.close()
    longest = max(len(r.getMessage()) for r in caplog.records)
    assert longest < 4000, f"a log line of {longest:,} characters"
    figure("DRA hostile claims (each its own error, others prepared)", f"{len(HOSTILE) + 1} kinds; longest log line {longest}")


def truncated(path: Path) -> None:
    path.write_text('{"version": 2, "claims": {"abc": {"state": "Prep')


def not_json(path: Path) -> None:
    path.write_bytes(b"\xff\xfe not json at all")


def wrong_types(path: Path) -> None:
    path.write_text('{"version": 2, "claims": ["not", "a", "mapping"]}')


def claim_twice(path: Path) -> None:
    uid = "eeeeeeee-0000-4000-8000-000000000001"
    record = {"state": "PrepareCompleted", "namespace": "d", "name": "n", "driver": DRIVER, "resource": "example.com/fpga"}
    text = json.dumps(record)[:-1] + ', "devices": [], "spec_file": ""}'
    path.write_text(f'{{"version": 2, "claims": {{"{uid}": {text}, "{uid}": {{"state": 7}}}}}}')  # the last one wins: unusable


def symlink(path: Path) -> None:
    target = path.with_name("elsewhere.json")
    target.write_text('{"version": 2, "claims": {}}')
    path.symlink_to(target)


def fifo(path: Path) -> None:
    os.mkfifo(path)


@pytest.mark.parametrize("make", [truncated, not_json, wrong_types, claim_twice, symlink, fifo])
async def test_a_hostile_checkpoint_is_set_aside_and_the_daemon_serves(
    config: Config, dra_world: World, api: ApiServerStandIn, caplog: pytest.LogCaptureFixture, make: Any
) -> None:
    checkpoint = dra_world.state_dir / "dra-claims.json"
    make(checkpoint)
    good = put(api, 1, "good", [result("fpga-0")], [])
    async with DraKubeletStandIn(dra_world.plugins_registry_dir) as kubelet, running_daemon(config, dra_world):
        conn = await asyncio.wait_for(kubelet.wait_registered(DRIVER), 10)
        answer = (await conn.prepare([good]))[good.uid]
        assert not answer.error, answer.error
        await conn.close()
    aside = [p.name for p in dra_world.state_dir.iterdir() if ".corrupt-" in p.name]
    assert aside, f"nothing set aside: {sorted(p.name for p in dra_world.state_dir.iterdir())}"
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR and "checkpoint" in r.getMessage()]
    assert errors and all(str(checkpoint) in e for e in errors), errors
    figure(f"DRA hostile checkpoint {make.__name__}", f"set aside as {aside[0].split('.json')[1]}; daemon served")
