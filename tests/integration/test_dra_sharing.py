"""Shared devices and partitions through the real daemon, in-process, against the DRA kubelet
stand-in and the API-server stand-in (real gRPC over unix sockets, real HTTP).

The fake backend serves ``example.com/gpu`` (two 80Gi GPUs several claims share) and
``example.com/tile`` (one tile in halves and quarters) as DRA drivers. Covers: the slices carry
``allowMultipleAllocations`` and the request policy, the tile's counter set in a slice of its
own and its partitions' counter consumption; two claims holding shares of gpu-0 (as the
scheduler allocates them: a shareID and the consumed capacity each) are answered with distinct
CDI IDs carrying the share ID, each spec's env telling its share's memory; the first unprepare
leaves the other claim's spec alone; a partition claim gets its partition's env.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from cdiplug.config import Config, parse_config
from cdiplug.models.world import World
from cdiplug.testing import ApiServerStandIn, DraKubeletStandIn
from cdiplug.testing.daemon import running_daemon
from cdiplug.testing.dra_kubelet import ClaimRef

NODE = "node-1"
GPU, TILE = "gpu.example.com", "tile.example.com"
UID1 = "11111111-2222-3333-4444-555555555555"
UID2 = "66666666-7777-8888-9999-000000000000"
UID3 = "aaaaaaaa-7777-8888-9999-000000000000"


@pytest.fixture
def config() -> Config:
    policy = {"value": "80Gi", "default": "1Gi", "min": "1Gi", "step": "1Gi"}
    return parse_config(
        {
            "resources": [
                {
                    "name": "example.com/gpu",
                    "backend": "fake",
                    "api": "dra",
                    "options": {"count": 2, "shared": True, "capacity": {"memory": policy}},
                },
                {"name": "example.com/tile", "backend": "fake", "api": "dra", "options": {"count": 1, "partitions": [1, 2, 4]}},
            ]
        },
        source="test_dra_sharing",
    )


@pytest.fixture
def node_name() -> str:
    return NODE


def claim(uid: str, driver: str, device: str, share: str | None = None, memory: str = "") -> dict[str, Any]:
    result: dict[str, Any] = {"request": "r", "driver": driver, "pool": NODE, "device": device}
    if share is not None:
        result |= {"shareID": share, "consumedCapacity": {"memory": memory}}
    return {
        "metadata": {"name": f"claim-{uid[:8]}", "namespace": "default", "uid": uid},
        "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": driver}}]}},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }


def ref_of(obj: dict[str, Any]) -> ClaimRef:
    meta = obj["metadata"]
    return ClaimRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])


def env_of(world: World, uid: str) -> list[str]:
    spec = json.loads((world.cdi_dir / f"cdiplug-claim-{uid}.json").read_text())
    return [e for d in spec["devices"] for e in d["containerEdits"]["env"]] + spec["containerEdits"]["env"]


async def test_shares_and_partitions_through_the_daemon(config: Config, dra_world: World, api: ApiServerStandIn) -> None:
    async with DraKubeletStandIn(dra_world.plugins_registry_dir) as kubelet, running_daemon(config, dra_world):
        gpu = await asyncio.wait_for(kubelet.wait_registered(GPU), 10)
        tile = await asyncio.wait_for(kubelet.wait_registered(TILE), 10)
        await asyncio.wait_for(api.wait_for(lambda: len(api.slices(spec__driver=TILE)) == 2 and api.slices(spec__driver=GPU)), 10)
        (gpu_slice,) = api.slices(spec__driver=GPU)
        shared = {d["name"]: d for d in gpu_slice["spec"]["devices"]}["gpu-0"]
        assert shared["allowMultipleAllocations"] is True
        assert shared["capacity"]["memory"]["requestPolicy"] == {"default": "1Gi", "validRange": {"min": "1Gi", "step": "1Gi"}}
        tile_slices = api.slices(spec__driver=TILE)
        assert [len(s["spec"].get("sharedCounters") or []) for s in tile_slices].count(1) == 1
        parts = {d["name"]: d for s in tile_slices for d in s["spec"].get("devices") or []}
        assert sorted(parts) == sorted(["tile-0", "tile-0-1of2", "tile-0-2of2", *(f"tile-0-{k}of4" for k in range(1, 5))])

        a = api.put_claim(claim(UID1, GPU, "gpu-0", "abcde", "30Gi"))
        b = api.put_claim(claim(UID2, GPU, "gpu-0", "fghij", "20Gi"))
        answers = {**await gpu.prepare([ref_of(a)]), **await gpu.prepare([ref_of(b)])}
        assert [d.cdi_ids for d in answers[UID1].devices] == [(f"k8s.{GPU}/claim={UID1}-gpu-0-abcde",)]
        assert [d.cdi_ids for d in answers[UID2].devices] == [(f"k8s.{GPU}/claim={UID2}-gpu-0-fghij",)]
        assert answers[UID1].devices[0].device == "gpu-0"
        assert "FAKE_GPU_MEMORY_0=30Gi" in env_of(dra_world, UID1) and "FAKE_GPU_MEMORY_0=20Gi" in env_of(dra_world, UID2)
        assert await gpu.unprepare([ref_of(a)]) == {UID1: ""}
        assert (dra_world.cdi_dir / f"cdiplug-claim-{UID2}.json").exists()
        assert await gpu.unprepare([ref_of(b)]) == {UID2: ""}

        half = api.put_claim(claim(UID3, TILE, "tile-0-2of2"))
        answer = (await tile.prepare([ref_of(half)]))[UID3]
        assert answer.error == "" and answer.devices[0].cdi_ids == (f"k8s.{TILE}/claim={UID3}-tile-0-2of2",)
        assert "FAKE_TILE_DEVICE_0_2OF2=tile-0-2of2" in env_of(dra_world, UID3)
        assert "FAKE_TILE_DEVICES=tile-0-2of2" in env_of(dra_world, UID3)
