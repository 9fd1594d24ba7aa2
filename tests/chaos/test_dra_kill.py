"""kill -9 of a real DRA daemon between the backend's preparation and PrepareCompleted.

A real ``python -m cdiplug serve`` serves ``example.com/fpga`` as DRA driver ``fpga.example.com``
with the fake backend's visible preparation (``prepared_dir``: a marker file per prepared device,
removed on release), against the API-server stand-in (HTTP, lightkube) and the DRA kubelet
stand-in (real gRPC on the unix sockets). ``CDIPLUG_DRA_PAUSE_AFTER`` stops the prepare right after
a step (the backend prepared; the claim's CDI spec written) and the test sends SIGKILL there, the
way test_kill_cycles.py kills the VFIO child after a chosen write. A second daemon then starts on
the same folders and the kubelet either unprepares the claim, never asks again, or prepares it
again: released (no marker, no spec, nothing in the checkpoint) in the first two, prepared whole
(marker, spec, PrepareCompleted) in the third — never half. Bound: 6 cases, ~8 s each on 2 shared cores.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import attrs
import pytest
import yaml

from cdiplug.models.world import World
from cdiplug.testing import ApiServerStandIn, DraKubeletStandIn
from cdiplug.testing.dra_kubelet import ClaimRef
from cdiplug.testing.process import daemon_process

from .conftest import figure

DRIVER = "fpga.example.com"
NODE = "node-k"
UID = "9a9a9a9a-1111-4222-8333-444444444444"
REF = ClaimRef("default", "kill-me", UID)
CYCLES: list[str] = []


@pytest.fixture
def node_name() -> str:
    """The node the shared ``api`` fixture (tests/conftest.py) knows."""
    return NODE


def dra_args(world: World, short_tmp: Path, api: ApiServerStandIn) -> list[str]:
    return [
        "--plugins-registry-dir",
        str(world.plugins_registry_dir),
        "--plugins-dir",
        str(world.plugins_dir),
        "--node-name",
        NODE,
        "--kubeconfig",
        str(api.kubeconfig(short_tmp / "kubeconfig")),
    ]


def checkpoint(world: World) -> dict[str, Any]:
    path = world.state_dir / "dra-claims.json"
    return json.loads(path.read_text())["claims"] if path.exists() else {}


@pytest.mark.parametrize("step", ["prepared", "spec"])
@pytest.mark.parametrize("then", ["unprepare", "never-again", "prepare-again"])
async def test_kill_9_before_prepare_completed(
    chaos_world: World, short_tmp: Path, api: ApiServerStandIn, monkeypatch: pytest.MonkeyPatch, step: str, then: str
) -> None:
    world = attrs.evolve(chaos_world, plugins_registry_dir=short_tmp / "reg", plugins_dir=short_tmp / "plugins")
    marks = short_tmp / "prepared"
    config = short_tmp / "config.yaml"
    options = {"count": 2, "prepared_dir": str(marks)}
    config.write_text(
        yaml.safe_dump({"resources": [{"name": "example.com/fpga", "backend": "fake", "api": "dra", "options": options}]})
    )
    args = dra_args(world, short_tmp, api)
    results = [{"request": "fpga", "driver": DRIVER, "pool": NODE, "device": "fpga-1"}]
    api.put_claim(
        {
            "metadata": {"name": REF.name, "namespace": REF.namespace, "uid": UID},
            "status": {"allocation": {"devices": {"results": results}}},
        }
    )
    spec = world.cdi_dir / f"cdiplug-claim-{UID}.json"

    async with DraKubeletStandIn(world.plugins_registry_dir, timeout=20) as kubelet:
        monkeypatch.setenv("CDIPLUG_DRA_PAUSE_AFTER", step)
        async with daemon_process(world, config, *args) as daemon:
            conn = await asyncio.wait_for(kubelet.wait_registered(DRIVER), 20)
            call = asyncio.create_task(conn.prepare([REF]))
            await daemon.wait_for(f"cdiplug-test-hook: DRA paused after {step}")
            # Killed here: the backend prepared (and, at "spec", the claim's spec is written).
            assert (marks / "fpga-1").exists() and spec.exists() == (step == "spec")
            assert checkpoint(world)[UID]["state"] == "PrepareStarted"
            assert [d["device_id"] for d in checkpoint(world)[UID]["devices"]] == ["fpga-1"]
            await daemon.kill()
            with pytest.raises(Exception):  # noqa: B017 - the call dies with the process, however grpc says it
                await call
            await conn.close()
        monkeypatch.delenv("CDIPLUG_DRA_PAUSE_AFTER")

        async with daemon_process(world, config, *args) as daemon:
            conn = await asyncio.wait_for(kubelet.wait_registered(DRIVER), 20)
            await daemon.wait_for("rolled back claim default/kill-me")
            if then == "unprepare":
                assert await conn.unprepare([REF]) == {UID: ""}
            elif then == "prepare-again":
                answer = (await conn.prepare([REF]))[UID]
                assert not answer.error and answer.devices[0].cdi_ids == (f"k8s.{DRIVER}/claim={UID}-fpga-1",)
            assert await daemon.stop() == 0
            daemon.check_log(str(config))
            await conn.close()

    if then == "prepare-again":
        assert (marks / "fpga-1").exists() and spec.exists() and checkpoint(world)[UID]["state"] == "PrepareCompleted"
    else:
        assert not (marks / "fpga-1").exists(), "the device is still prepared"
        assert not spec.exists() and checkpoint(world) == {}
    CYCLES.append(f"{step}/{then}")
    figure(
        "DRA kill -9 before PrepareCompleted (released or prepared whole after restart)",
        f"{len(CYCLES)} cases: {', '.join(CYCLES)}",
    )
