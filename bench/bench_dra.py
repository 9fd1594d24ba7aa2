#!/usr/bin/env python3
"""Benchmark of the DRA front end: prints one JSON object of figures (see bench/README.md).

Against the stand-ins of ``cdiplug.testing`` (real gRPC over unix sockets, real HTTP on 127.0.0.1):

- ``prepare_ms_p50/p99``, ``unprepare_ms_p50/p99``: the daemon (in this process) serving a fake
  resource as a DRA driver; ``--claims`` (50) ResourceClaims of one device each, prepared one
  after the other over ``v1.DRAPlugin`` (API read, preparation, CDI spec, checkpoint), then
  unprepared (spec removed, release, checkpoint);
- ``prepare_cN_ms_p50/p99``, ``unprepare_cN_ms_p50/p99`` for N in ``--concurrency`` (1, 8, 64):
  N claims prepared at once, each in its own ``NodePrepareResources`` call (as the kubelet calls
  per pod), then unprepared at once, ``--rounds`` (8) times; ``burst_cN_s`` the median wall time
  of one such round; ``cpu_ms_per_claim_cN`` this process's CPU (daemon and stand-ins) per claim
  prepared and unprepared, steadier than wall times on a busy machine; ``rss_mib_before_bursts`` / ``rss_mib_after_bursts``: this process's
  ``VmRSS`` (daemon and stand-ins) before the first round and after the last;
- ``slice_build_ms``: building the slice bodies of ``--devices`` (4096) devices (pure);
- ``slice_publish_s``: the publisher's first publish of those devices to the API stand-in
  (``--devices`` / 128 slices created) until the last write is answered;
- ``slice_republish_s``: one device turning unhealthy -> the whole pool published again (a new
  generation; with a taint the slices hold 64 devices each).

The caller (kubelet stand-in) and the API stand-in are Python in the same process and event loop
as the daemon: the figures are upper bounds of what the daemon itself costs.
Run: ``python bench/bench_dra.py [--claims 50] [--devices 4096] [--concurrency 1,8,64] [--rounds 8]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs

from cdiplug.config import parse_config
from cdiplug.dra.publisher import SlicePublisher
from cdiplug.dra.slices import UnhealthyPolicy, pool_devices, slice_body, split
from cdiplug.kube.client import LightkubeClient
from cdiplug.kube.credentials import load_kubeconfig
from cdiplug.models.devices import Device, DeviceSnapshot, Health
from cdiplug.models.world import World
from cdiplug.testing import ApiServerStandIn, DraKubeletStandIn
from cdiplug.testing.daemon import running_daemon
from cdiplug.testing.dra_kubelet import ClaimRef

NODE = "bench-node"
DRIVER = "fpga.example.com"
TIMEOUT = 60.0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


async def timed(call: Any) -> float:
    started = time.perf_counter()
    await call
    return (time.perf_counter() - started) * 1000


async def burst_figures(conn: Any, refs: list[ClaimRef], levels: list[int], rounds: int) -> dict[str, float]:
    """Per level N: N claims prepared at once (one call each), then unprepared at once, ``rounds`` times."""
    figures: dict[str, float] = {"rss_mib_before_bursts": rss_mib()}

    async def prepare(ref: ClaimRef) -> None:
        answer = await conn.prepare([ref])
        if answer[ref.uid].error:
            raise SystemExit(f"prepare failed: {answer[ref.uid].error}")

    async def unprepare(ref: ClaimRef) -> None:
        errors = await conn.unprepare([ref])
        if errors[ref.uid]:
            raise SystemExit(f"unprepare failed: {errors[ref.uid]}")

    for n in levels:
        prepared: list[float] = []
        unprepared: list[float] = []
        walls: list[float] = []
        cpu = time.process_time()
        for _ in range(rounds):
            batch = refs[:n]
            started = time.perf_counter()
            prepared += await asyncio.gather(*(timed(prepare(r)) for r in batch))
            walls.append(time.perf_counter() - started)
            unprepared += await asyncio.gather(*(timed(unprepare(r)) for r in batch))
        figures[f"prepare_c{n}_ms_p50"] = round(statistics.median(prepared), 2)
        figures[f"prepare_c{n}_ms_p99"] = round(percentile(prepared, 0.99), 2)
        figures[f"unprepare_c{n}_ms_p50"] = round(statistics.median(unprepared), 2)
        figures[f"unprepare_c{n}_ms_p99"] = round(percentile(unprepared, 0.99), 2)
        figures[f"burst_c{n}_s"] = round(statistics.median(walls), 4)
        figures[f"cpu_ms_per_claim_c{n}"] = round((time.process_time() - cpu) * 1000 / (n * rounds), 2)
    figures["rss_mib_after_bursts"] = rss_mib()
    return figures


def claim(i: int) -> dict[str, Any]:
    uid = f"00000000-0000-4000-8000-{i:012d}"
    return {
        "metadata": {"name": f"bench-{i}", "namespace": "default", "uid": uid},
        "status": {
            "allocation": {"devices": {"results": [{"request": "fpga", "driver": DRIVER, "pool": NODE, "device": f"fpga-{i}"}]}}
        },
    }


async def prepare_figures(folder: Path, claims: int, levels: list[int], rounds: int) -> dict[str, float]:
    count = max(claims, *levels)
    config = parse_config(
        {"resources": [{"name": "example.com/fpga", "backend": "fake", "api": "dra", "options": {"count": count}}]},
        source="bench_dra",
    )
    async with ApiServerStandIn() as api:
        api.put_node(NODE)
        world = World(
            kubelet_dir=folder / "kubelet",
            cdi_dir=folder / "cdi",
            state_dir=folder / "state",
            sysfs_root=folder / "sys",
            dev_root=folder,
            pod_resources_socket=folder / "pr.sock",
            plugins_registry_dir=folder / "reg",
            plugins_dir=folder / "plugins",
            node_name=NODE,
            kubeconfig=api.kubeconfig(folder / "kubeconfig"),
        )
        refs = []
        for i in range(count):
            obj = api.put_claim(claim(i))
            refs.append(ClaimRef("default", obj["metadata"]["name"], obj["metadata"]["uid"]))
        async with DraKubeletStandIn(world.plugins_registry_dir) as kubelet, running_daemon(config, world):
            conn = await asyncio.wait_for(kubelet.wait_registered(DRIVER), TIMEOUT)
            await asyncio.wait_for(api.wait_for(lambda: bool(api.slices(spec__driver=DRIVER))), TIMEOUT)
            prepare, unprepare = [], []
            for ref in refs[:claims]:
                started = time.perf_counter()
                answer = await conn.prepare([ref])
                prepare.append((time.perf_counter() - started) * 1000)
                if answer[ref.uid].error:
                    raise SystemExit(f"prepare failed: {answer[ref.uid].error}")
            for ref in refs[:claims]:
                started = time.perf_counter()
                errors = await conn.unprepare([ref])
                unprepare.append((time.perf_counter() - started) * 1000)
                if errors[ref.uid]:
                    raise SystemExit(f"unprepare failed: {errors[ref.uid]}")
            bursts = await burst_figures(conn, refs, levels, rounds)
    return {
        **bursts,
        "claims": claims,
        "prepare_ms_p50": round(statistics.median(prepare), 2),
        "prepare_ms_p99": round(percentile(prepare, 0.99), 2),
        "unprepare_ms_p50": round(statistics.median(unprepare), 2),
        "unprepare_ms_p99": round(percentile(unprepare, 0.99), 2),
    }


async def slice_figures(folder: Path, devices: int) -> dict[str, float]:
    snapshot = DeviceSnapshot(
        "example.com/many",
        [Device(f"many-{i}", numa_nodes=(i % 2,), attributes={"model": "fake", "index": i}) for i in range(devices)],
    )
    started = time.perf_counter()
    specs = split(pool_devices(snapshot, UnhealthyPolicy.TAINT))
    bodies = [slice_body(s, driver=DRIVER, node=NODE, generation=1, count=len(specs), owner=None) for s in specs]
    build_ms = (time.perf_counter() - started) * 1000
    async with ApiServerStandIn() as api:
        api.put_node(NODE)
        client = LightkubeClient(load_kubeconfig(api.kubeconfig(folder / "kubeconfig-slices")))
        publisher = SlicePublisher(client, DRIVER, NODE)
        task = asyncio.create_task(publisher.run(), name="bench publisher")
        try:
            started = time.perf_counter()
            publisher.want(snapshot)
            await asyncio.wait_for(publisher.wait_published(1), TIMEOUT)
            publish_s = time.perf_counter() - started
            first = devices // 2
            changed = snapshot.with_devices(
                attrs.evolve(d, health=Health.UNHEALTHY) if d.id == f"many-{first}" else d for d in snapshot.devices
            )
            started = time.perf_counter()
            publisher.want(changed)
            await asyncio.wait_for(publisher.wait_published(2), TIMEOUT)
            republish_s = time.perf_counter() - started
            published = sum(len(s["spec"]["devices"]) for s in api.slices(spec__driver=DRIVER))
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await client.close()
    return {
        "devices": devices,
        "slices": len(bodies),
        "slice_build_ms": round(build_ms, 1),
        "slice_publish_s": round(publish_s, 3),
        "slice_republish_s": round(republish_s, 3),
        "devices_published": published,
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="cdp-bench-"))
    try:
        for name in ("kubelet", "cdi", "state", "sys"):
            (folder / name).mkdir()
        figures: dict[str, Any] = {}
        figures.update(await prepare_figures(folder, args.claims, [int(n) for n in args.concurrency.split(",")], args.rounds))
        figures.update(await slice_figures(folder, args.devices))
        return figures
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--claims", type=int, default=50, help="claims prepared and unprepared (default 50)")
    parser.add_argument("--devices", type=int, default=4096, help="devices published in slices (default 4096)")
    parser.add_argument("--concurrency", default="1,8,64", help="claims prepared at once, per level (default 1,8,64)")
    parser.add_argument("--rounds", type=int, default=8, help="rounds per concurrency level (default 8)")
    print(json.dumps(asyncio.run(main(parser.parse_args())), indent=1))
