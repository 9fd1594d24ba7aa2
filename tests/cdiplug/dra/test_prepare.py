"""Claims prepared and unprepared through the backend host (cdiplug.dra.prepare.ClaimPreparer).

A recording backend with a Preparer (which changes the device, as a VFIO bind adds its device
node) and an Unpreparer stands behind a real BackendHost; the API is a small stub at the client
seam. Covers: the spec holds the device as prepared; preparation runs once for a repeated
prepare; the checkpoint answers after a "restart" (a new preparer on the same state folder);
unprepare releases through the Unpreparer, but not a device another claim still holds; a claim
on a device the node lacks, or before the backend reported, is an error that prepares nothing.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

import attrs
import pytest

from cdiplug.backend import BackendPlugin, SnapshotSink
from cdiplug.dra.checkpoint import ClaimStore
from cdiplug.dra.claims import ClaimRef
from cdiplug.dra.prepare import ClaimPreparer
from cdiplug.errors import DeviceUnavailable, KubernetesError
from cdiplug.host import BackendHost
from cdiplug.model import ContainerEdits, Device, DeviceNode, DeviceSnapshot
from cdiplug.resource import Api, ResourceConfig
from cdiplug.supervisor import Supervisor
from cdiplug.world import World

RESOURCE = "example.com/nic"
DRIVER = "nic.example.com"


@attrs.frozen
class Options:
    pass


class Recording:
    prepared: list[list[str]]
    released: list[list[str]]

    def __init__(self, resources: Sequence[ResourceConfig[Options]], world: World) -> None:
        self.prepared, self.released = [], []
        Recording.last = self

    async def run(self, sink: SnapshotSink) -> None:
        devices = [Device(f"nic-{i}", edits=ContainerEdits(env={"NIC": str(i)}), prepare_group=f"g{i}") for i in range(3)]
        sink.publish(DeviceSnapshot(RESOURCE, devices, ids_env="NIC_IDS"))

    async def prepare(self, resource: str, devices: Sequence[Device]) -> Sequence[Device]:
        self.prepared.append([d.id for d in devices])
        return [attrs.evolve(d, edits=d.edits.merge(ContainerEdits(device_nodes=[DeviceNode(f"/dev/{d.id}")]))) for d in devices]

    def release_interval(self, resource: str) -> float | None:
        return None

    async def releasable(self, resource: str) -> Sequence[str]:
        return []

    async def unprepare(self, resource: str, device_ids: Sequence[str]) -> None:
        self.released.append(list(device_ids))


PLUGIN = BackendPlugin(name="rec", options_type=Options, create=Recording)
RC = ResourceConfig(RESOURCE, "rec", Options(), api=Api.DRA, dra_driver=DRIVER)


class Claims:
    """The client seam: ResourceClaims by (namespace, name)."""

    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.reads = 0

    def add(self, uid: str, devices: list[str]) -> ClaimRef:
        name = f"c-{uid[:4]}"
        results = [{"request": "nic", "driver": DRIVER, "pool": "n1", "device": d} for d in devices]
        self.claims[("ns", name)] = {"metadata": {"uid": uid}, "status": {"allocation": {"devices": {"results": results}}}}
        return ClaimRef("ns", name, uid)

    async def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        self.reads += 1
        try:
            return self.claims[(namespace, name)]
        except KeyError:
            raise KubernetesError(f"resourceclaims {name} not found", 404) from None


@pytest.fixture
async def host(world: World) -> AsyncIterator[BackendHost]:
    supervisor = Supervisor()
    host = BackendHost(world, supervisor, plugins={"rec": PLUGIN})
    host.create([RC])
    reported = asyncio.Event()

    class Listener:
        def offer(self, snapshot: DeviceSnapshot) -> None:
            reported.set()

    host.attach(RESOURCE, Listener())
    host.start()
    await asyncio.wait_for(reported.wait(), 5)
    yield host
    await host.stop()
    await supervisor.close()


def preparer(host: BackendHost, world: World, claims: Claims, store: ClaimStore) -> ClaimPreparer:
    return ClaimPreparer(RC, "n1", host, store, lambda: claims, world.cdi_dir)  # type: ignore[arg-type, return-value]


UID_A = "aaaaaaaa-0000-0000-0000-000000000001"
UID_B = "bbbbbbbb-0000-0000-0000-000000000002"


async def test_prepare_release_and_restart(host: BackendHost, world: World) -> None:
    claims = Claims()
    store = ClaimStore(world.state_dir)
    await store.load()
    prep = preparer(host, world, claims, store)
    backend: Recording = Recording.last
    a = claims.add(UID_A, ["nic-0", "nic-1"])
    b = claims.add(UID_B, ["nic-1"])  # a device two claims hold (admin access, say)
    done = await prep.prepare(a)
    assert [d.cdi_ids for d in done.devices] == [(f"k8s.{DRIVER}/claim={UID_A}-nic-0",), (f"k8s.{DRIVER}/claim={UID_A}-nic-1",)]
    spec = json.loads((world.cdi_dir / f"cdiplug-claim-{UID_A}.json").read_text())
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [{"path": "/dev/nic-0", "permissions": "rw"}]  # as prepared
    assert spec["containerEdits"]["env"] == ["NIC_IDS=nic-0,nic-1"]
    assert await prep.prepare(a) == done
    assert backend.prepared == [["nic-0"], ["nic-1"]]  # one group at a time, each once
    await prep.prepare(b)

    # A restarted daemon: a new store and preparer on the same folder; no API read, no preparation.
    store2 = ClaimStore(world.state_dir)
    await store2.load()
    prep2 = preparer(host, world, claims, store2)
    reads = claims.reads
    assert await prep2.prepare(a) == done and claims.reads == reads
    await prep2.unprepare(a)
    assert backend.released == [["nic-0"]]  # nic-1 is still held by claim B
    assert not (world.cdi_dir / f"cdiplug-claim-{UID_A}.json").exists()
    await prep2.unprepare(b)
    assert backend.released == [["nic-0"], ["nic-1"]]
    await prep2.unprepare(a)  # already gone: nothing more
    assert store2.all() == []


async def test_claims_that_cannot_be_prepared(host: BackendHost, world: World) -> None:
    claims = Claims()
    store = ClaimStore(world.state_dir)
    prep = preparer(host, world, claims, store)
    with pytest.raises(DeviceUnavailable, match="nic-9"):
        await prep.prepare(claims.add(UID_A, ["nic-0", "nic-9"]))
    with pytest.raises(KubernetesError):
        await prep.prepare(ClaimRef("ns", "missing", UID_B))
    assert Recording.last.prepared == [] and store.all() == []
    assert not list(world.cdi_dir.iterdir())
