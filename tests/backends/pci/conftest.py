"""Fixtures of the PCI backend tests: a fake sysfs tree in the test's World, a fake kernel for
binding, resources parsed through the real config loader, and a sink that queues snapshots."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from cdiplug.config import parse_config
from cdiplug.models.resource import ResourceConfig
from cdiplug.models.world import World
from cdiplug.testing.sink import RecordingSink
from cdiplug.testing.sink import running as run_backend
from cdiplug_backends.pci import PciBackend, plugin
from cdiplug_backends.pci.testing import FakeSysfsKernel, SysfsTree

DEADLINE = 5.0


def resources(*specs: tuple[str, dict[str, Any]]) -> tuple[ResourceConfig, ...]:
    """``resources(("example.com/nic", {"selectors": [...]}), ...)`` through the real config loader."""
    data = {"resources": [{"name": n, "backend": "pci", "options": o} for n, o in specs]}
    return parse_config(data, "test.yaml", plugins={"pci": plugin}).resources


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
    tree.add_function(
        "0000:3b:00.0", vendor=0x8086, device=0x1572, driver="i40e", iommu_group=5, numa_node=numa, netdevs=["ens1f0"]
    )
    return tree.add_vfs(
        "0000:3b:00.0",
        [f"0000:3b:02.{i}" for i in range(vfs)],
        device=0x154C,
        driver="iavf",
        first_group=40,
        netdev_prefix="ens1f0",
    )


@contextlib.asynccontextmanager
async def running(backend: PciBackend) -> AsyncIterator[RecordingSink]:
    """Run ``backend`` until the block ends; yields its sink once every resource has published."""
    sink = RecordingSink()
    async with run_backend(backend, sink, timeout=DEADLINE):
        yield sink


def make_backend(world: World, specs: Sequence[tuple[str, dict[str, Any]]], **kwargs: Any) -> PciBackend:
    return PciBackend(resources(*specs), world, **kwargs)
