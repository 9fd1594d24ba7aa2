"""Fixtures of the PCI backend tests: a fake sysfs tree in the test's World, a fake kernel for
binding, resources parsed through the real config loader, and a sink that queues snapshots."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import pytest

from backends.pci import PciBackend, plugin
from cdiplug.config import ResourceConfig, parse_config
from cdiplug.model import DeviceSnapshot
from cdiplug.testing.sysfs import FakeSysfsKernel, SysfsTree
from cdiplug.world import World

DEADLINE = 5.0


def resources(*specs: tuple[str, dict[str, Any]]) -> tuple[ResourceConfig, ...]:
    """``resources(("example.com/nic", {"selectors": [...]}), ...)`` through the real config loader."""
    data = {"resources": [{"name": n, "backend": "pci", "options": o} for n, o in specs]}
    return parse_config(data, "test.yaml", plugins={"pci": plugin}).resources


class QueueSink:
    """Keeps every published snapshot; ``until`` awaits the next one that satisfies a predicate."""

    def __init__(self) -> None:
        self.latest: dict[str, DeviceSnapshot] = {}
        self.history: list[DeviceSnapshot] = []
        self._changed = asyncio.Event()

    def publish(self, snapshot: DeviceSnapshot) -> None:
        self.latest[snapshot.resource] = snapshot
        self.history.append(snapshot)
        self._changed.set()

    async def until(
        self, resource: str, predicate: Callable[[DeviceSnapshot], bool] = lambda s: True, timeout: float = DEADLINE
    ) -> DeviceSnapshot:
        """The latest snapshot of ``resource`` once ``predicate`` holds for it (woken by publishes)."""
        async with asyncio.timeout(timeout):
            while True:
                current = self.latest.get(resource)
                if current is not None and predicate(current):
                    return current
                self._changed.clear()
                await self._changed.wait()


@pytest.fixture
def tree(world: World) -> SysfsTree:
    t = SysfsTree(world.sysfs_root, world.dev_root)
    t.enable_vfio()
    return t


@pytest.fixture
def kernel(tree: SysfsTree) -> FakeSysfsKernel:
    return FakeSysfsKernel(tree)


def add_nic_with_vfs(tree: SysfsTree, vfs: int = 2, numa: int = 1) -> list[str]:
    """An Intel PF 0000:3b:00.0 (i40e, ens1f0, group 5) with ``vfs`` VFs 0000:3b:02.N (iavf, groups 40+)."""
    tree.add_function("0000:3b:00.0", vendor=0x8086, device=0x1572, driver="i40e", iommu_group=5, numa_node=numa, netdevs=["ens1f0"])
    return tree.add_vfs(
        "0000:3b:00.0", [f"0000:3b:02.{i}" for i in range(vfs)], device=0x154C, driver="iavf", first_group=40, netdev_prefix="ens1f0"
    )


@contextlib.asynccontextmanager
async def running(backend: PciBackend) -> AsyncIterator[QueueSink]:
    """Run ``backend`` until the block ends; yields its sink once every resource has published."""
    sink = QueueSink()
    task = asyncio.create_task(backend.run(sink), name="test:pci-backend")
    try:
        for r in backend.resources:
            waiter = asyncio.ensure_future(sink.until(r.name))
            await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
            if task.done():
                waiter.cancel()
                task.result()
                raise AssertionError("the backend stopped before publishing")
            waiter.result()
        yield sink
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def make_backend(world: World, specs: Sequence[tuple[str, dict[str, Any]]], **kwargs: Any) -> PciBackend:
    return PciBackend(resources(*specs), world, **kwargs)
