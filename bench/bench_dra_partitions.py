#!/usr/bin/env python3
"""Benchmark of publishing a partitioned device's ResourceSlices: prints one JSON object (see bench/README.md).

Against the API-server stand-in of ``cdiplug.testing`` (real HTTP on 127.0.0.1), the slice
publisher of the DRA front end, the fake backend's devices:

- ``partitions_publish_ms_p50`` / ``_p99``: one fake device cut into every profile of
  ``--profiles`` (default 1, 2, 4, 8, 16, 32: the whole device and 62 parts, 63 partitions, each
  consuming its slices of the device's counter set, which goes in a slice of its own), published
  ``--rounds`` times (one partition's health flipped each round: the pool is written again, a
  new generation, every slice);
- the floor, in the same run, the same way: as many whole devices without counters (one slice).
  ``ratio`` is what partitions cost over plain devices of the same number.

Run: ``python bench/bench_dra_partitions.py [--rounds 30] [--profiles 1,2,4,8,16,32]``.
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
from cdiplug.kube.client import LightkubeClient
from cdiplug.kube.credentials import load_kubeconfig
from cdiplug.models.devices import Device, DeviceSnapshot, Health
from cdiplug.models.world import World
from cdiplug.testing import ApiServerStandIn
from cdiplug_backends.fake import FakeBackend

NODE = "bench-node"
TIMEOUT = 60.0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def partitioned(folder: Path, profiles: list[int]) -> DeviceSnapshot:
    data = {
        "resources": [
            {"name": "example.com/tile", "backend": "fake", "api": "dra", "options": {"count": 1, "partitions": profiles}}
        ]
    }
    (resource,) = parse_config(data, "bench").resources
    world = World(kubelet_dir=folder, cdi_dir=folder, state_dir=folder, sysfs_root=folder, dev_root=folder)
    return FakeBackend([resource], world).snapshot(resource, {})


def flipped(snapshot: DeviceSnapshot, round_: int) -> DeviceSnapshot:
    victim = snapshot.devices[-1].id
    health = Health.UNHEALTHY if round_ % 2 else Health.HEALTHY
    return snapshot.with_devices(attrs.evolve(d, health=health) if d.id == victim else d for d in snapshot.devices)


async def publish_times(client: LightkubeClient, driver: str, snapshot: DeviceSnapshot, rounds: int) -> tuple[list[float], int]:
    publisher = SlicePublisher(client, driver, NODE)
    task = asyncio.create_task(publisher.run(), name=f"bench publisher {driver}")
    times = []
    try:
        publisher.want(snapshot)
        await asyncio.wait_for(publisher.wait_published(1), TIMEOUT)  # the first publish creates: not measured
        for r in range(1, rounds + 1):
            started = time.perf_counter()
            publisher.want(flipped(snapshot, r))
            await asyncio.wait_for(publisher.wait_published(r + 1), TIMEOUT)
            times.append((time.perf_counter() - started) * 1000)
        slices = len((await client.list_slices(driver, NODE))[0])
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return times, slices


def figure(ours: float, floor: float) -> dict[str, Any]:
    return {"cdiplug": round(ours, 3), "floor": round(floor, 3), "ratio": round(ours / floor, 3), "goal": None, "met": None}


async def main(args: argparse.Namespace) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="cdp-bench-"))
    try:
        snapshot = partitioned(folder, args.profiles)
        plain = DeviceSnapshot("example.com/plain", [Device(f"plain-{i}") for i in range(len(snapshot.devices))])
        async with ApiServerStandIn() as api:
            api.put_node(NODE)
            client = LightkubeClient(load_kubeconfig(api.kubeconfig(folder / "kubeconfig")))
            try:
                # Interleaved halves, so a slow spell of the machine falls on both.
                ours: list[float] = []
                floor: list[float] = []
                for half in range(2):
                    t, slices = await publish_times(client, f"tile{half}.example.com", snapshot, args.rounds // 2)
                    ours += t
                    f, floor_slices = await publish_times(client, f"plain{half}.example.com", plain, args.rounds // 2)
                    floor += f
            finally:
                await client.close()
        return {
            "partitions": len(snapshot.devices),
            "counter_sets": len(snapshot.sharing.counter_sets if snapshot.sharing else ()),
            "slices": slices,
            "floor_slices": floor_slices,
            "rounds": len(ours),
            "partitions_publish_ms_p50": figure(statistics.median(ours), statistics.median(floor)),
            "partitions_publish_ms_p99": figure(percentile(ours, 0.99), percentile(floor, 0.99)),
        }
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30, help="publishes measured, per kind (default 30)")
    parser.add_argument(
        "--profiles",
        type=lambda text: [int(p) for p in text.split(",")],
        default=[1, 2, 4, 8, 16, 32],
        help="the fake device's partition profiles (default 1,2,4,8,16,32: 63 partitions)",
    )
    print(json.dumps(asyncio.run(main(parser.parse_args())), indent=1))
