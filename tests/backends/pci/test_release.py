"""``release: restore`` (backends.pci.release) end to end in one process: the PCI backend over a fake
sysfs tree with the fake kernel, asking a real grpc.aio PodResources stand-in on a unix socket
which devices pods hold; functions nobody holds go back to their original driver after the grace
time, held and freshly bound ones stay, and a silent kubelet restores nothing."""

from __future__ import annotations

import grpc
import pytest

from backends.pci.journal import Journal
from cdiplug.errors import KubeletError
from cdiplug.testing import PodResourcesStandIn
from cdiplug.testing.sysfs import SysfsTree
from cdiplug.world import World

from .conftest import add_nic_with_vfs, make_backend, running

RESOURCE = "example.com/nic-vfio"


def spec(**extra) -> tuple[str, dict]:
    return (RESOURCE, {"selectors": [{"pf": "ens1f0"}], "vfio": True, "release": "restore", "release_grace": 30, **extra})


async def test_unheld_functions_are_restored_after_the_grace_time(world: World, tree: SysfsTree, kernel) -> None:
    add_nic_with_vfs(tree, vfs=3)
    now = [1000.0]
    backend = make_backend(world, [spec()], writer=kernel)
    backend.binder.clock = backend.releaser.clock = lambda: now[0]
    async with PodResourcesStandIn(world.pod_resources_socket) as kubelet, running(backend) as sink:
        devices = sink.latest[RESOURCE].devices
        for d in devices:
            await backend.prepare(RESOURCE, [d])
        kubelet.hold("default", "vm-0", "compute", RESOURCE, ["0000:3b:02.0"])
        assert await backend.releaser.once() == []  # all within the grace time
        now[0] += 31
        assert await backend.releaser.once() == ["0000:3b:02.1", "0000:3b:02.2"]
        assert tree.driver_of("0000:3b:02.0") == "vfio-pci"
        assert tree.driver_of("0000:3b:02.1") == tree.driver_of("0000:3b:02.2") == "iavf"
        snap = await sink.until(RESOURCE, lambda s: s.get("0000:3b:02.1").attribute("driver") == "iavf")
        assert snap.get("0000:3b:02.0").attribute("driver") == "vfio-pci"
        assert set(Journal(world.state_dir).all_bound()) == {"0000:3b:02.0"}
        kubelet.release_pod("default", "vm-0")
        assert await backend.releaser.once() == ["0000:3b:02.0"]
        assert kubelet.list_calls >= 3  # the backend's own timer asks too


async def test_replicas_and_other_resources(world: World, tree: SysfsTree, kernel) -> None:
    add_nic_with_vfs(tree, vfs=2)
    keep = ("example.com/keep", {"selectors": [{"addresses": ["0000:3b:02.1"]}], "vfio": True})
    backend = make_backend(world, [keep, spec(release_grace=0.001)], writer=kernel)
    async with PodResourcesStandIn(world.pod_resources_socket) as kubelet, running(backend) as sink:
        await backend.prepare(RESOURCE, sink.latest[RESOURCE].devices)
        await backend.prepare("example.com/keep", sink.latest["example.com/keep"].devices)
        kubelet.hold("default", "shared", "c", RESOURCE, ["0000:3b:02.0::1"])
        assert await backend.releaser.once() == []  # held as a replica; keep: not ours to restore
        kubelet.release_pod("default", "shared")
        assert await backend.releaser.once() == ["0000:3b:02.0"]
        assert tree.driver_of("0000:3b:02.1") == "vfio-pci"


async def test_a_kubelet_that_does_not_answer_restores_nothing(world: World, tree: SysfsTree, kernel) -> None:
    add_nic_with_vfs(tree, vfs=1)
    backend = make_backend(world, [spec(release_grace=0.001)], writer=kernel)
    async with PodResourcesStandIn(world.pod_resources_socket) as kubelet, running(backend) as sink:
        await backend.prepare(RESOURCE, sink.latest[RESOURCE].devices)
        kubelet.fail_with = grpc.StatusCode.UNAVAILABLE
        with pytest.raises(KubeletError, match="UNAVAILABLE"):
            await backend.releaser.once()
        assert tree.driver_of("0000:3b:02.0") == "vfio-pci"


async def test_release_runs_on_its_own_in_the_backend(world: World, tree: SysfsTree, kernel) -> None:
    add_nic_with_vfs(tree, vfs=1)
    backend = make_backend(world, [spec(release_grace=0.001, release_interval=0.05)], writer=kernel)
    async with PodResourcesStandIn(world.pod_resources_socket) as kubelet:
        kubelet.hold("default", "vm-0", "compute", RESOURCE, ["0000:3b:02.0"])
        async with running(backend) as sink:
            await backend.prepare(RESOURCE, sink.latest[RESOURCE].devices)
            await sink.until(RESOURCE, lambda s: s.get("0000:3b:02.0").attribute("driver") == "vfio-pci")
            kubelet.release_pod("default", "vm-0")
            await sink.until(RESOURCE, lambda s: s.get("0000:3b:02.0").attribute("driver") == "iavf")
