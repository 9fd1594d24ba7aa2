"""``release: restore`` end to end in one process: the PCI backend (its Unpreparer ability,
cdiplug_backends.pci.release) over a fake sysfs tree with the fake kernel, run by the real backend
host, and the device-plugin front end's Releaser asking a real grpc.aio PodResources stand-in on
a unix socket which devices pods hold; functions nobody holds go back to their original driver
after the grace time, held and freshly bound ones stay, and a silent kubelet restores nothing."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import grpc
import pytest

from cdiplug.backend import BackendPlugin
from cdiplug.deviceplugin.release import Releaser
from cdiplug.errors import KubeletError
from cdiplug.host import BackendHost
from cdiplug.models.world import World
from cdiplug.testing import PodResourcesStandIn
from cdiplug.testing.sink import RecordingSink
from cdiplug.toolkit.supervisor import Supervisor
from cdiplug_backends.pci import PciBackend, PciOptions
from cdiplug_backends.pci.journal import Journal
from cdiplug_backends.pci.testing import SysfsTree

from .conftest import add_nic_with_vfs, make_backend


class Listener:
    """The host's listener end, recording into a sink."""

    def __init__(self, sink: RecordingSink) -> None:
        self.offer = sink.publish


class Hosted:
    def __init__(self, host: BackendHost, releaser: Releaser, sink: RecordingSink) -> None:
        self.host, self.releaser, self.sink = host, releaser, sink

    async def once(self) -> list[str]:
        return [device for _, device in await self.releaser.once()]


@contextlib.asynccontextmanager
async def hosted(world: World, backend: PciBackend, start_releaser: bool = False) -> AsyncIterator[Hosted]:
    """``backend`` run by the real host; the releaser looks after its resources."""
    supervisor = Supervisor()
    host = BackendHost(world, supervisor, plugins={"pci": BackendPlugin("pci", PciOptions, lambda resources, w: backend)})
    host.create(backend.resources)
    sink = RecordingSink()
    names = [r.name for r in backend.resources]
    for name in names:
        host.attach(name, Listener(sink))
    host.start()
    releaser = Releaser(host, world.pod_resources_socket, supervisor)
    releaser.update(dict.fromkeys(names))
    if start_releaser:
        releaser.start()
    try:
        for name in names:
            await sink.until(name, lambda s: True)
        yield Hosted(host, releaser, sink)
    finally:
        await supervisor.close()
        await host.stop()


RESOURCE = "example.com/nic-vfio"


def spec(**extra) -> tuple[str, dict]:
    return (RESOURCE, {"selectors": [{"pf": "ens1f0"}], "vfio": True, "release": "restore", "release_grace": 30, **extra})


async def test_unheld_functions_are_restored_after_the_grace_time(world: World, tree: SysfsTree, kernel) -> None:
    add_nic_with_vfs(tree, vfs=3)
    now = [1000.0]
    backend = make_backend(world, [spec()], writer=kernel)
    backend.binder.clock = lambda: now[0]
    async with PodResourcesStandIn(world.pod_resources_socket) as kubelet, hosted(world, backend) as h:
        devices = h.sink.latest[RESOURCE].devices
        for d in devices:
            await backend.prepare(RESOURCE, [d])
        kubelet.hold("default", "vm-0", "compute", RESOURCE, ["0000:3b:02.0"])
        assert await h.once() == []  # all within the grace time
        now[0] += 31
        assert await h.once() == ["0000:3b:02.1", "0000:3b:02.2"]
        assert tree.driver_of("0000:3b:02.0") == "vfio-pci"
        assert tree.driver_of("0000:3b:02.1") == tree.driver_of("0000:3b:02.2") == "iavf"
        snap = await h.sink.until(RESOURCE, lambda s: s.get("0000:3b:02.1").attribute("driver") == "iavf")
        assert snap.get("0000:3b:02.0").attribute("driver") == "vfio-pci"
        assert set(Journal(world.state_dir).all_bound()) == {"0000:3b:02.0"}
        kubelet.release_pod("default", "vm-0")
        assert await h.once() == ["0000:3b:02.0"]
        assert kubelet.list_calls == 3


async def test_replicas_and_other_resources(world: World, tree: SysfsTree, kernel) -> None:
    add_nic_with_vfs(tree, vfs=2)
    keep = ("example.com/keep", {"selectors": [{"addresses": ["0000:3b:02.1"]}], "vfio": True})
    backend = make_backend(world, [keep, spec(release_grace=0.001)], writer=kernel)
    async with PodResourcesStandIn(world.pod_resources_socket) as kubelet, hosted(world, backend) as h:
        await backend.prepare(RESOURCE, h.sink.latest[RESOURCE].devices)
        await backend.prepare("example.com/keep", h.sink.latest["example.com/keep"].devices)
        kubelet.hold("default", "shared", "c", RESOURCE, ["0000:3b:02.0::1"])
        assert await h.once() == []  # held as a replica; keep: not ours to restore
        kubelet.release_pod("default", "shared")
        assert await h.once() == ["0000:3b:02.0"]
        assert tree.driver_of("0000:3b:02.1") == "vfio-pci"


async def test_a_kubelet_that_does_not_answer_restores_nothing(world: World, tree: SysfsTree, kernel) -> None:
    add_nic_with_vfs(tree, vfs=1)
    backend = make_backend(world, [spec(release_grace=0.001)], writer=kernel)
    async with PodResourcesStandIn(world.pod_resources_socket) as kubelet, hosted(world, backend) as h:
        await backend.prepare(RESOURCE, h.sink.latest[RESOURCE].devices)
        kubelet.fail_with = grpc.StatusCode.UNAVAILABLE
        with pytest.raises(KubeletError, match="UNAVAILABLE"):
            await h.once()
        assert tree.driver_of("0000:3b:02.0") == "vfio-pci"


async def test_release_runs_on_its_own(world: World, tree: SysfsTree, kernel) -> None:
    add_nic_with_vfs(tree, vfs=1)
    backend = make_backend(world, [spec(release_grace=0.001, release_interval=0.05)], writer=kernel)
    async with PodResourcesStandIn(world.pod_resources_socket) as kubelet:
        kubelet.hold("default", "vm-0", "compute", RESOURCE, ["0000:3b:02.0"])
        async with hosted(world, backend, start_releaser=True) as h:
            await backend.prepare(RESOURCE, h.sink.latest[RESOURCE].devices)
            await h.sink.until(RESOURCE, lambda s: s.get("0000:3b:02.0").attribute("driver") == "vfio-pci")
            kubelet.release_pod("default", "vm-0")
            await h.sink.until(RESOURCE, lambda s: s.get("0000:3b:02.0").attribute("driver") == "iavf")
