"""200 DRA claims prepared at once through a real daemon process, three times over: all succeed, memory flat.

A real ``python -m cdiplug serve`` serves 200 fake FPGAs as DRA driver ``fpga.example.com``
against the API-server stand-in (HTTP, lightkube) and the DRA kubelet stand-in (real gRPC). 200
claims of one device each are prepared by 200 concurrent NodePrepareResources calls, then
unprepared the same way; three times. Every call succeeds; the prepare latency (p50, p99, as the
kubelet sees it) is printed; RSS and open files of the daemon after the third round are within
bounds of the second (no leak per claim: a leak of a file, a socket or of 10 KiB per claim would show).
Bound: ~20 s on 2 shared cores.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import attrs
import pytest
import yaml

from cdiplug.models.world import World
from cdiplug.testing import ApiServerStandIn, DraKubeletStandIn
from cdiplug.testing.dra_kubelet import ClaimRef, DraPluginConnection
from cdiplug.testing.process import daemon_process

from .conftest import figure, proc_figures

DRIVER = "fpga.example.com"
NODE = "node-l"
CLAIMS = 200
CONNECTION_POOL = 100
"""httpx's default bound on connections to the API server (lightkube's client uses it)."""


@pytest.fixture
def node_name() -> str:
    """The node the shared ``api`` fixture (tests/conftest.py) knows."""
    return NODE


def put_claims(api: ApiServerStandIn) -> list[ClaimRef]:
    refs = []
    for i in range(CLAIMS):
        uid = f"{i:08x}-0000-4000-8000-{i:012x}"
        name = f"load-{i}"
        results = [{"request": "fpga", "driver": DRIVER, "pool": NODE, "device": f"fpga-{i}"}]
        api.put_claim(
            {
                "metadata": {"name": name, "namespace": "default", "uid": uid},
                "status": {"allocation": {"devices": {"results": results}}},
            }
        )
        refs.append(ClaimRef("default", name, uid))
    return refs


async def round_trip(conn: DraPluginConnection, refs: list[ClaimRef]) -> list[float]:
    async def prepare(ref: ClaimRef) -> float:
        started = time.perf_counter()
        answer = (await conn.prepare([ref]))[ref.uid]
        assert not answer.error, answer.error
        return time.perf_counter() - started

    latencies = await asyncio.gather(*(prepare(r) for r in refs))
    answers = await asyncio.gather(*(conn.unprepare([r]) for r in refs))
    assert all(a == {r.uid: ""} for a, r in zip(answers, refs))
    return sorted(latencies)


async def test_200_claims_at_once_three_times(chaos_world: World, short_tmp: Path, api: ApiServerStandIn) -> None:
    world = attrs.evolve(chaos_world, plugins_registry_dir=short_tmp / "reg", plugins_dir=short_tmp / "plugins")
    config = short_tmp / "config.yaml"
    resource = {"name": "example.com/fpga", "backend": "fake", "api": "dra", "options": {"count": CLAIMS}}
    config.write_text(yaml.safe_dump({"resources": [resource]}))
    refs = put_claims(api)
    args = ["--plugins-registry-dir", str(world.plugins_registry_dir), "--plugins-dir", str(world.plugins_dir)]
    args += ["--node-name", NODE, "--kubeconfig", str(api.kubeconfig(short_tmp / "kubeconfig"))]
    async with DraKubeletStandIn(world.plugins_registry_dir, timeout=60) as kubelet:
        async with daemon_process(world, config, *args) as daemon:
            conn = await asyncio.wait_for(kubelet.wait_registered(DRIVER), 30)
            await asyncio.wait_for(api.wait_for(lambda: sum(len(s["spec"]["devices"]) for s in api.slices()) == CLAIMS), 30)
            # The first rounds fill what is bounded and kept (the HTTP connection pool: 100): the
            # third is measured against the second.
            first = await round_trip(conn, refs)
            await round_trip(conn, refs)
            after_first = proc_figures(daemon.pid)
            second = await round_trip(conn, refs)
            after_second = proc_figures(daemon.pid)
            assert await daemon.stop() == 0
            daemon.check_log(str(config))
            await conn.close()
    assert not list(world.cdi_dir.glob("cdiplug-claim-*.json"))
    # Sockets come and go with the API client's connection pool (idle ones close after 5 s, so what
    # a round leaves open depends on timing, up to the pool's bound); nothing else may grow.
    files = {k: f["open_fds"] - f["sockets"] for k, f in (("first", after_first), ("second", after_second))}
    assert files["second"] <= files["first"] + 2, (after_first, after_second)
    assert after_second["sockets"] <= after_first["sockets"] + CONNECTION_POOL, (after_first, after_second)
    assert after_second["rss_kib"] <= after_first["rss_kib"] * 1.05 + 2048, (after_first, after_second)
    p50, p99 = second[len(second) // 2], second[int(len(second) * 0.99) - 1]
    figure(
        "DRA load: 200 claims prepared at once (third round)",
        f"all ok; prepare p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms (first round p99 {first[int(len(first) * 0.99) - 1] * 1000:.0f} ms); "
        f"RSS {after_first['rss_kib']} -> {after_second['rss_kib']} KiB, open files {after_first['open_fds']} -> {after_second['open_fds']}",
    )
