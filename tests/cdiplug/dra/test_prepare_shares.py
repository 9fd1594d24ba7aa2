"""Preparing claims that hold shares of a device (KEP-5075) and claims several pods share.

A recording backend whose devices allow multiple allocations (80Gi of memory, the consumed
amount told in ``GPU_MEMORY_<i>``) stands behind a real BackendHost; the API is a stub at the
client seam. Covers: each share's CDI device is named ``<claim uid>-<device>-<shareID>`` (two
claims on one device, and two shares of one device in one claim, never define one CDI device);
the container's env says what its share consumed (two shares of one device in one claim:
comma-joined); the device is prepared once and released only when its last share is
unprepared; the share survives a restart (checkpoint) and a wiped CDI folder (restore) with
its name and env; the status entry of a share carries its shareID. A claim several pods
reference is prepared once: the kubelet's repeated prepare (one per pod) answers the same
devices without preparing or reading the claim again, and its unprepare releases it.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from cdiplug.dra.checkpoint import ClaimStore
from cdiplug.dra.claims import ClaimRef
from cdiplug.dra.prepare import ClaimPreparer, NodeContext
from cdiplug.errors import InvalidRequest
from cdiplug.host import BackendHost
from cdiplug.models.devices import ContainerEdits, Device, DeviceSnapshot
from cdiplug.models.sharing import DeviceSharing, RequestPolicy
from cdiplug.models.world import World
from cdiplug.testing.dra_claims import ClaimsAtSeam, RecordingBackend

RESOURCE = "example.com/gpu"
DRIVER = "gpu.example.com"
UID_A = "aaaaaaaa-0000-0000-0000-000000000001"
UID_B = "bbbbbbbb-0000-0000-0000-000000000002"


class Recording(RecordingBackend):
    def snapshot(self) -> DeviceSnapshot:
        devices = [
            Device(
                f"gpu-{i}",
                edits=ContainerEdits(env={f"GPU_{i}": "yes"}),
                capacity={"memory": "80Gi"},
                sharing=DeviceSharing(True, {"memory": RequestPolicy(default="1Gi")}, {"memory": f"GPU_MEMORY_{i}"}),
            )
            for i in range(2)
        ]
        return DeviceSnapshot(RESOURCE, devices, ids_env="GPU_IDS")

    def prepared_device(self, device: Device) -> Device:
        return device


PLUGIN = Recording.plugin()
RC = Recording.dra_resource(RESOURCE, DRIVER)


class Claims(ClaimsAtSeam):
    def __init__(self) -> None:
        super().__init__(DRIVER, "n1")

    def add(self, uid: str, results: list[tuple[str, str | None, str]]) -> ClaimRef:
        """results: (device, share ID, memory consumed)."""
        return self.put(
            uid,
            [
                self.result(device, f"r{i}", share=share, consumed=None if share is None else {"memory": memory})
                for i, (device, share, memory) in enumerate(results)
            ],
        )


def preparer(host: BackendHost, world: World, claims: Claims, store: ClaimStore) -> ClaimPreparer:
    return ClaimPreparer(RC, NodeContext("n1"), host, store, lambda: claims)  # type: ignore[arg-type, return-value]


def spec(world: World, uid: str) -> dict[str, Any]:
    return json.loads((world.cdi_dir / f"cdiplug-claim-{uid}.json").read_text())


def env_of(spec: dict[str, Any]) -> dict[str, dict[str, str]]:
    return {d["name"]: dict(e.split("=", 1) for e in d["containerEdits"]["env"]) for d in spec["devices"]}


async def test_shares_of_one_device_are_named_apart_and_told_what_they_consumed(
    host: BackendHost, world: World, store: ClaimStore
) -> None:
    claims = Claims()
    prep = preparer(host, world, claims, store)
    backend: Recording = Recording.last
    a = claims.add(UID_A, [("gpu-0", "s1a2b", "30Gi")])
    b = claims.add(UID_B, [("gpu-0", "x9y8z", "20Gi"), ("gpu-0", "q7r6s", "10Gi")])  # two shares in one claim

    done_a = await prep.prepare(a)
    assert [d.cdi_ids for d in done_a.devices] == [(f"k8s.{DRIVER}/claim={UID_A}-gpu-0-s1a2b",)]
    assert [(d.device, d.share_id) for d in done_a.devices] == [("gpu-0", "s1a2b")]  # the slice's name answered
    assert env_of(spec(world, UID_A)) == {f"{UID_A}-gpu-0-s1a2b": {"GPU_0": "yes", "GPU_MEMORY_0": "30Gi"}}
    done_b = await prep.prepare(b)
    assert [d.cdi_ids[0].rpartition("-")[2] for d in done_b.devices] == ["x9y8z", "q7r6s"]
    assert {e["GPU_MEMORY_0"] for e in env_of(spec(world, UID_B)).values()} == {"20Gi,10Gi"}
    assert backend.prepared == [["gpu-0"]]  # prepared once: the second claim found it prepared
    await prep.status_settled()
    assert [(e["device"], e.get("shareID")) for e in claims.statuses[-1]] == [("gpu-0", "x9y8z"), ("gpu-0", "q7r6s")]

    # A restart, then a wiped CDI folder: the share comes back with its name and its env.
    for path in world.cdi_dir.iterdir():
        path.unlink()
    store2 = ClaimStore(world.state_dir)
    await store2.load()
    prep2 = preparer(host, world, claims, store2)
    assert await prep2.prepare(a) == done_a
    assert env_of(spec(world, UID_A)) == {f"{UID_A}-gpu-0-s1a2b": {"GPU_0": "yes", "GPU_MEMORY_0": "30Gi"}}

    await prep2.unprepare(a)
    assert backend.released == []  # claim B still holds shares of gpu-0
    await prep2.unprepare(b)
    assert backend.released == [["gpu-0"]]


async def test_a_claim_several_pods_share_is_prepared_once(host: BackendHost, world: World) -> None:
    claims = Claims()
    store = ClaimStore(world.state_dir)
    prep = preparer(host, world, claims, store)
    backend: Recording = Recording.last
    ref = claims.add(UID_A, [("gpu-1", None, "")])
    first = await prep.prepare(ref)
    reads = claims.reads
    second, third = await asyncio.gather(prep.prepare(ref), prep.prepare(ref))  # the kubelet, once per pod
    assert first == second == third and claims.reads == reads
    assert [d.cdi_ids for d in first.devices] == [(f"k8s.{DRIVER}/claim={UID_A}-gpu-1",)]
    assert env_of(spec(world, UID_A))[f"{UID_A}-gpu-1"] == {"GPU_1": "yes"}  # a whole device: no share env
    assert backend.prepared == [["gpu-1"]]
    await prep.unprepare(ref)  # the kubelet unprepares once, after the last pod
    assert backend.released == [["gpu-1"]] and store.all() == []


async def test_a_share_id_no_name_may_hold_is_refused(host: BackendHost, world: World) -> None:
    claims = Claims()
    prep = preparer(host, world, claims, ClaimStore(world.state_dir))
    with pytest.raises(InvalidRequest, match=r"shareID"):
        await prep.prepare(claims.add(UID_A, [("gpu-0", "../x", "1Gi")]))
    with pytest.raises(InvalidRequest, match=r"consumedCapacity\.memory"):
        await prep.prepare(claims.add(UID_B, [("gpu-0", "abcde", "lots")]))
    assert Recording.last.prepared == [] and not list(world.cdi_dir.iterdir())
