"""One served resource's snapshot pipeline (cdiplug.deviceplugin.resource): coalescing, order, reload.

Runs the real Allocator, the real CDI SpecWriter in a temporary folder (wrapped to record what the
server had published when each write came) and a real ResourceServer that is not started (publish
only stores the list for ListAndWatch); metrics are a recorder. The updater runs as a real task.
"""

from __future__ import annotations

import asyncio
from typing import Any

import attrs

from cdiplug.backend import Abilities
from cdiplug.cdi.writer import SpecWriter, same_spec
from cdiplug.deviceplugin import resource
from cdiplug.deviceplugin.allocator import Allocator
from cdiplug.deviceplugin.resource import ServedResource
from cdiplug.deviceplugin.server import ResourceServer
from cdiplug.deviceplugin.settings import DevicePluginSettings
from cdiplug.host import SpecKeeper
from cdiplug.models.devices import ContainerEdits, Device, DeviceNode, DeviceSnapshot, Health
from cdiplug.models.resource import ResourceConfig
from cdiplug.models.world import World
from cdiplug.testing.poll import eventually

RESOURCE = "example.com/fpga"


def snapshot(*ids: str, unhealthy: tuple[str, ...] = ()) -> DeviceSnapshot:
    return DeviceSnapshot(
        RESOURCE,
        [
            Device(
                i,
                health=Health.UNHEALTHY if i in unhealthy else Health.HEALTHY,
                edits=ContainerEdits(device_nodes=[DeviceNode(f"/dev/{i}")]),
            )
            for i in ids
        ],
    )


class RecordingWriter(SpecWriter):
    """The real writer, noting what the server advertised when each write began."""

    def __init__(self, world: World, server: list[ResourceServer]) -> None:
        super().__init__(world.cdi_dir)
        self.server = server
        self.seen_at_write: list[DeviceSnapshot | None] = []

    def write(self, kind: str, snap: DeviceSnapshot) -> bool:
        self.seen_at_write.append(self.server[0].advertised)
        return super().write(kind, snap)


class RecordingMetrics:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def devices(self, resource: str, healthy: int, unhealthy: int, causes: Any = None) -> None:
        self.calls.append((resource, healthy, unhealthy))


def served(world: World, replicas: int = 1, asked: bool = True) -> tuple[ServedResource, RecordingWriter, RecordingMetrics]:
    rc = ResourceConfig(name=RESOURCE, backend="test", options=None, settings=DevicePluginSettings(replicas=replicas))
    holder: list[ResourceServer] = []
    writer = RecordingWriter(world, holder)
    keeper = SpecKeeper(writer, rc.cdi_kind)
    allocator = Allocator(rc, Abilities(), spec=keeper)
    holder.append(ResourceServer(rc.name, rc.socket_name, world.kubelet_dir, allocator))
    metrics = RecordingMetrics()
    res = ServedResource(rc, allocator, holder[0], keeper, metrics)  # type: ignore[arg-type]
    if asked:  # as the front end marks it once the first Register call ended
        res.asked.set()
    return res, writer, metrics


async def taken(res: ServedResource) -> None:
    """The updater took what was offered (the check for an unchanged snapshot is synchronous)."""
    await eventually(lambda: res.pending is None and not res.wake.is_set(), "the updater took the snapshot")


def test_same_spec_ignores_health_only():
    assert same_spec(snapshot("a", "b"), snapshot("a", "b", unhealthy=("b",)))
    assert not same_spec(None, snapshot("a"))
    assert not same_spec(snapshot("a"), snapshot("a", "b"))
    assert not same_spec(snapshot("a"), snapshot("b"))
    moved = snapshot("a").with_devices([Device("a", edits=ContainerEdits(device_nodes=[DeviceNode("/dev/other")]))])
    assert not same_spec(snapshot("a"), moved)
    assert not same_spec(snapshot("a"), attrs.evolve(snapshot("a"), common_edits=ContainerEdits(env={"X": "1"})))


async def test_offer_reaches_the_allocator_at_once_and_a_burst_coalesces(world: World):
    res, writer, metrics = served(world)
    task = asyncio.create_task(res.run_updates(), name="update")
    try:
        res.offer(snapshot("a"))
        res.offer(snapshot("a", "b"))
        assert res.allocator.snapshot == snapshot("a", "b")  # before the updater ran
        await eventually(lambda: res.server.advertised == snapshot("a", "b"), "published")
        assert res.applied == snapshot("a", "b")
        # The spec follows the list (its write begins in a worker thread): one write, of both.
        await eventually(lambda: writer.seen_at_write, "the spec written")
        assert writer.seen_at_write == [snapshot("a", "b")] and metrics.calls == [(RESOURCE, 2, 0)]
        res.offer(snapshot("a", "b"))  # unchanged: nothing happens
        await taken(res)
        assert len(writer.seen_at_write) == 1 and len(metrics.calls) == 1
    finally:
        task.cancel()


async def test_the_first_spec_waits_for_the_first_register_call(world: World):
    res, writer, _ = served(world, asked=False)
    task = asyncio.create_task(res.run_updates(), name="update")
    try:
        res.offer(snapshot("a"))
        await eventually(lambda: res.server.advertised == snapshot("a"), "published")
        await asyncio.sleep(0.05)  # a while for a write that must not come before the Register call
        assert writer.seen_at_write == []
        res.asked.set()
        # The file, not the write's start (which the writer notes before its worker thread writes).
        spec = world.cdi_dir / "cdiplug-example.com-fpga.json"
        await eventually(spec.exists, "the spec written once the kubelet was asked")
        assert writer.seen_at_write == [snapshot("a")]
    finally:
        task.cancel()


async def test_a_first_snapshot_without_devices_is_written_at_once(world: World, monkeypatch: Any):
    # No Register may follow it (register_when_empty: false waits for a device): nothing to wait for.
    monkeypatch.setattr(resource, "FIRST_SPEC_WAIT", 60)
    res, writer, _ = served(world, asked=False)
    task = asyncio.create_task(res.run_updates(), name="update")
    try:
        res.offer(snapshot())
        await eventually(lambda: len(writer.seen_at_write) == 1, "the spec of no devices written")
        assert not res.asked.is_set()
    finally:
        task.cancel()


async def test_a_stop_while_the_first_spec_waits_is_not_lost(world: World):
    # The front end cancels the register and update tasks together; the register task's end sets
    # the event the updater waits for. The updater must still end, or the daemon's stop hangs.
    res, _, _ = served(world, asked=False)
    task = asyncio.create_task(res.run_updates(), name="update")
    res.offer(snapshot("a"))
    await eventually(lambda: res.server.advertised == snapshot("a"), "published")
    await asyncio.sleep(0)  # the updater now waits for the Register call
    res.asked.set()  # in one turn of the loop: the event's waiter wakes first, then the cancel
    task.cancel()
    await asyncio.wait({task}, timeout=5)
    assert task.cancelled()


async def test_the_first_spec_does_not_wait_for_a_register_call_that_hangs(world: World, monkeypatch: Any):
    monkeypatch.setattr(resource, "FIRST_SPEC_WAIT", 0.05)
    res, writer, _ = served(world, asked=False)
    task = asyncio.create_task(res.run_updates(), name="update")
    try:
        res.offer(snapshot("a"))
        await eventually(lambda: len(writer.seen_at_write) == 1, "the spec written after the wait")
        assert not res.asked.is_set()
    finally:
        task.cancel()


async def test_the_kubelet_hears_first_and_an_allocate_waits_for_the_spec(world: World):
    res, writer, metrics = served(world)
    task = asyncio.create_task(res.run_updates(), name="update")
    try:
        res.offer(snapshot("a"))
        await eventually(lambda: res.server.advertised == snapshot("a"), "published")
        # An Allocate at once (the kubelet may send one as soon as it hears): its CDI device's
        # spec is on disk before the answer, written by the updater or by the Allocate itself.
        (answer,) = await res.allocator.allocate([["a"]])
        spec = world.cdi_dir / "cdiplug-example.com-fpga.json"
        assert answer.cdi_devices == ("example.com/fpga=a",) and '"name": "a"' in spec.read_text()
        await taken(res)
        assert writer.seen_at_write[0] == snapshot("a")  # the kubelet had heard when the write began
        res.offer(snapshot("a", unhealthy=("a",)))
        await eventually(lambda: res.server.advertised == snapshot("a", unhealthy=("a",)), "health published")
        await taken(res)
        # Health is no part of the spec: the kubelet heard, and the file was not even looked at again.
        assert len(writer.seen_at_write) == 1, [(s.devices[0].health if s else None) for s in writer.seen_at_write]
        assert metrics.calls[-1] == (RESOURCE, 0, 1)
    finally:
        task.cancel()


async def test_replace_allocator_reapplies_the_last_snapshot_under_the_new_config(world: World):
    res, _, _ = served(world)
    task = asyncio.create_task(res.run_updates(), name="update")
    try:
        res.offer(snapshot("a"))
        await eventually(lambda: res.server.advertised == snapshot("a"), "published")
        rc = ResourceConfig(name=RESOURCE, backend="test", options=None, settings=DevicePluginSettings(replicas=2))
        new = Allocator(rc, Abilities())
        res.replace_allocator(rc, new, res.spec)
        assert res.server.allocator is new and new.snapshot == snapshot("a")
        await eventually(
            lambda: res.server.advertised is not None and res.server.advertised.ids == ("a::0", "a::1"), "replicas published"
        )
    finally:
        task.cancel()
