"""The backend host (cdiplug.host.backends) on its own: snapshots replayed to a listener that
attaches late, a backend told not to start empty (BackendInitError) ending the host's task, and
reload recreating only the backends whose resources changed.

In-test backends; the node tests run the host under the device-plugin front end and the kubelet
stand-in (fault isolation included).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from attrs import frozen

from cdiplug.backend import BackendPlugin, SnapshotSink
from cdiplug.errors import BackendInitError
from cdiplug.host import BackendHost
from cdiplug.models.devices import Device, DeviceSnapshot
from cdiplug.models.resource import ResourceConfig
from cdiplug.models.world import World
from cdiplug.toolkit.supervisor import Supervisor


@frozen
class Options:
    count: int = 1
    refuse: bool = False


class Backend:
    created: list[Backend] = []

    def __init__(self, resources: Sequence[ResourceConfig[Options]], world: World) -> None:
        self.resources = tuple(resources)
        self.created.append(self)

    async def run(self, sink: SnapshotSink) -> None:
        for r in self.resources:
            if r.options.refuse:
                raise BackendInitError(f"{r.name}: no devices and fail_on_init_error set")
            sink.publish(DeviceSnapshot(r.name, [Device(f"d{i}") for i in range(r.options.count)]))
        await asyncio.Event().wait()


class Listener:
    def __init__(self) -> None:
        self.seen: list[DeviceSnapshot] = []
        self.event = asyncio.Event()

    def offer(self, snapshot: DeviceSnapshot) -> None:
        self.seen.append(snapshot)
        self.event.set()


def rc(name: str, **options: object) -> ResourceConfig[Options]:
    return ResourceConfig(name=name, backend="test", options=Options(**options))  # type: ignore[arg-type]


@pytest.fixture
def host(world: World) -> BackendHost:
    Backend.created = []
    return BackendHost(world, Supervisor(), plugins={"test": BackendPlugin("test", Options, Backend)})


async def test_a_late_listener_gets_the_latest_snapshot(host: BackendHost) -> None:
    host.create([rc("example.com/a", count=2)])
    host.start()
    try:
        early = Listener()
        host.attach("example.com/a", early)
        await asyncio.wait_for(early.event.wait(), 5)
        late = Listener()
        host.attach("example.com/a", late)
        assert late.seen == early.seen and late.seen[0].ids == ("d0", "d1")
    finally:
        await host.supervisor.close()


async def test_a_backend_that_must_not_start_empty_stops_the_host(host: BackendHost) -> None:
    host.create([rc("example.com/a", refuse=True)])
    host.start()
    with pytest.raises(BackendInitError, match="fail_on_init_error"):
        await asyncio.wait_for(host.supervisor.wait(), 5)
    assert host.down() == []  # not restarted: it was told not to go on


async def test_reload_recreates_only_changed_backends(world: World) -> None:
    Backend.created = []
    plugins = {"test": BackendPlugin("test", Options, Backend), "other": BackendPlugin("other", Options, Backend)}
    host = BackendHost(world, Supervisor(), plugins=plugins)
    a = rc("example.com/a")
    b = ResourceConfig(name="example.com/b", backend="other", options=Options())
    host.create([a, b])
    host.start()
    try:
        assert await host.reload([a, b]) == frozenset()
        assert len(Backend.created) == 2
        recreated = await host.reload([rc("example.com/a", count=3), b])
        assert recreated == {"example.com/a"} and len(Backend.created) == 3
        assert host.backend("other") is Backend.created[1]
    finally:
        await host.supervisor.close()
