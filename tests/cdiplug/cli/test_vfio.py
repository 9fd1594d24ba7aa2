"""``cdiplug vfio status|bind|unbind`` on fake sysfs trees (SysfsTree): status and argument errors as
a subprocess; bind and unbind in-process through ``cdiplug.cli.main`` with the PCI backend's sysfs
writer swapped for cdiplug_backends.pci.testing.FakeSysfsKernel (a fake tree cannot react to real writes)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cdiplug.cli import main
from cdiplug.models.world import World
from cdiplug_backends.pci import vfio as vfio_module
from cdiplug_backends.pci.journal import Journal
from cdiplug_backends.pci.testing import FakeSysfsKernel, SysfsTree

VF = "0000:3b:02.0"


@pytest.fixture
def tree(world: World) -> SysfsTree:
    t = SysfsTree(world.sysfs_root, world.dev_root)
    t.enable_vfio()
    t.add_function("0000:3b:00.0", driver="i40e", iommu_group=5, numa_node=1, netdevs=["ens1f0"])
    t.add_vfs("0000:3b:00.0", [VF], driver="iavf", first_group=40, netdev_prefix="ens1f0")
    return t


@pytest.fixture
def kernel(tree: SysfsTree, monkeypatch: pytest.MonkeyPatch) -> FakeSysfsKernel:
    k = FakeSysfsKernel(tree)
    monkeypatch.setattr(vfio_module, "OsSysfsWriter", lambda: k)
    return k


def world_args(world: World) -> list[str]:
    return ["--sysfs-root", str(world.sysfs_root), "--dev-root", str(world.dev_root), "--state-dir", str(world.state_dir)]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cdiplug", *args], capture_output=True, text=True, timeout=60, check=False)


def test_status_as_a_subprocess(world: World, tree: SysfsTree) -> None:
    done = run_cli("vfio", "status", VF, *world_args(world))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"{VF}: 8086:154c class 0x020000",
        "  driver: iavf",
        "  driver_override: none",
        "  NUMA node: 1",
        f"  IOMMU group 40: {VF} (iavf)",
        "  device node: /dev/vfio/40 (absent)",
        "  SR-IOV VF of 0000:3b:00.0",
        "  network interfaces: ens1f0v0",
    ]


def test_bad_address_exits_2(world: World, tree: SysfsTree) -> None:
    done = run_cli("vfio", "bind", "../../etc", *world_args(world))
    assert done.returncode == 2 and "not a PCI address" in done.stderr


def test_unknown_function_exits_1(world: World, tree: SysfsTree) -> None:
    done = run_cli("vfio", "status", "0000:99:00.0", *world_args(world))
    assert done.returncode == 1 and "no such device 0000:99:00.0: no PCI function has this address" in done.stderr


def test_bind_then_unbind(world: World, tree: SysfsTree, kernel: FakeSysfsKernel, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["vfio", "bind", VF, *world_args(world)]) == 0
    assert capsys.readouterr().out == f"{VF}: bound to vfio-pci (/dev/vfio/40)\n"
    assert tree.driver_of(VF) == "vfio-pci"
    assert main(["vfio", "bind", VF, *world_args(world)]) == 0
    assert capsys.readouterr().out == f"{VF}: already on vfio-pci (/dev/vfio/40)\n"
    assert main(["vfio", "status", VF, *world_args(world)]) == 0
    out = capsys.readouterr().out
    assert "bound by cdiplug; original driver: iavf" in out and "/dev/vfio/40 (present)" in out
    assert main(["vfio", "unbind", VF, *world_args(world)]) == 0
    assert capsys.readouterr().out == f"{VF}: restored to iavf\n"
    assert tree.driver_of(VF) == "iavf" and Journal(world.state_dir).all_bound() == {}


def test_refused_bind_exits_1_and_changes_nothing(world: World, tree: SysfsTree, kernel: FakeSysfsKernel, capsys) -> None:
    (tree.drivers / "vfio-pci").rename(tree.drivers / "not-loaded")
    assert main(["vfio", "bind", VF, *world_args(world)]) == 1
    assert "vfio-pci driver is not loaded" in capsys.readouterr().err
    assert kernel.writes == [] and tree.driver_of(VF) == "iavf"
