"""In-use checks (cdiplug_backends.pci.safety) that need no netlink: mounted, swapped and held block devices
below a function (fake sysfs tree plus mountinfo/swaps files written by the test), the denylist,
and processes holding a /dev/vfio node open (a fake proc tree, and this very process for real)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cdiplug.errors import DeviceInUse
from cdiplug_backends.pci.safety import FunctionInUse, SafetyChecker, _mounted_devices
from cdiplug_backends.pci.sysfs import PciSysfs
from cdiplug_backends.pci.testing import SysfsTree

NVME = "0000:5e:00.0"


@pytest.fixture
def nvme(tree: SysfsTree) -> SysfsTree:
    tree.add_function(NVME, vendor=0x144D, device=0xA808, class_code=0x010802, driver="nvme", iommu_group=9)
    tree.add_block(NVME, "nvme0n1", "259:0", partitions=[("nvme0n1p1", "259:1"), ("nvme0n1p2", "259:2")])
    return tree


def checker(tree: SysfsTree, tmp_path: Path, mountinfo: str = "", swaps: str = "") -> SafetyChecker:
    (tmp_path / "mountinfo").write_text(mountinfo)
    proc = tmp_path / "proc"
    proc.mkdir(exist_ok=True)
    (proc / "swaps").write_text("Filename\tType\tSize\tUsed\tPriority\n" + swaps)
    return SafetyChecker(PciSysfs(tree.root), tmp_path / "mountinfo", proc)


MOUNTINFO = """\
22 1 259:1 / /data rw,relatime shared:1 - ext4 /dev/nvme0n1p1 rw
23 1 8:1 / / rw,relatime shared:2 - ext4 /dev/sda1 rw
24 1 259:7 / /mnt/with\\040space rw - xfs /dev/nvme1n1 rw
"""


def test_mountinfo_parsing(tmp_path: Path) -> None:
    (tmp_path / "mountinfo").write_text(MOUNTINFO)
    assert _mounted_devices(tmp_path / "mountinfo") == {"259:1": "/data", "8:1": "/", "259:7": "/mnt/with space"}
    assert _mounted_devices(tmp_path / "missing") == {}


async def test_mounted_partition_is_in_use(nvme: SysfsTree, tmp_path: Path) -> None:
    fn = PciSysfs(nvme.root).read_function(NVME)
    problems = await checker(nvme, tmp_path, MOUNTINFO).problems(fn)
    assert problems == ["block device nvme0n1p1 (259:1) is mounted on /data"]
    with pytest.raises(FunctionInUse) as err:
        await checker(nvme, tmp_path, MOUNTINFO).check_bind([fn])
    assert isinstance(err.value, DeviceInUse)
    assert err.value.device == NVME and "mounted on /data" in err.value.reason


async def test_swap_and_holders_are_in_use(nvme: SysfsTree, tmp_path: Path) -> None:
    nvme.add_holder("nvme0n1p2", "dm-0")
    fn = PciSysfs(nvme.root).read_function(NVME)
    problems = await checker(nvme, tmp_path, swaps="/dev/nvme0n1p1 partition 1024 0 -2\n").problems(fn)
    assert problems == ["block device nvme0n1p1 is in use as swap", "block device nvme0n1p2 is held by dm-0"]


async def test_unused_disk_and_other_functions_are_free(nvme: SysfsTree, tmp_path: Path) -> None:
    nvme.add_function("0000:5f:00.0", class_code=0x010802, driver="nvme", iommu_group=10)
    other = PciSysfs(nvme.root).read_function("0000:5f:00.0")
    assert await checker(nvme, tmp_path, MOUNTINFO).problems(other) == []
    fn = PciSysfs(nvme.root).read_function(NVME)
    assert await checker(nvme, tmp_path, "23 1 8:1 / / rw - ext4 /dev/sda1 rw\n").problems(fn) == []


async def test_denylisted_function_is_refused_naming_the_entry(nvme: SysfsTree, tmp_path: Path) -> None:
    fn = PciSysfs(nvme.root).read_function(NVME)
    with pytest.raises(FunctionInUse, match=r"on the denylist \(0000:5e:\*\)"):
        await checker(nvme, tmp_path).check_bind([fn], denied={NVME: "0000:5e:*"})


def test_open_by_reads_proc_fd_links(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    for pid, target, comm in (("100", "/dev/vfio/7", "qemu-kvm"), ("200", "/dev/null", "sh")):
        (proc / pid / "fd").mkdir(parents=True)
        (proc / pid / "fd" / "3").symlink_to(target)
        (proc / pid / "comm").write_text(comm + "\n")
    (proc / "self").mkdir()
    safety = SafetyChecker(PciSysfs(tmp_path / "sys"), proc_root=proc)
    assert safety.open_by(Path("/dev/vfio/7")) == ["100 (qemu-kvm)"]
    assert safety.open_by(Path("/dev/vfio/8")) == []


def test_open_by_sees_this_process_in_the_real_proc(tmp_path: Path) -> None:
    node = tmp_path / "fake-vfio-node"
    node.write_text("")
    with open(node) as held:
        assert held
        holders = SafetyChecker(PciSysfs(tmp_path)).open_by(node)
    assert f"{os.getpid()} ({Path('/proc/self/comm').read_text().strip()})" in holders
