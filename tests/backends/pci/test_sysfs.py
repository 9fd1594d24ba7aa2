"""Reading PCI functions (cdiplug_backends.pci.sysfs) from fake trees built with cdiplug_backends.pci.testing.SysfsTree:
IDs, class, driver, IOMMU groups and members, NUMA (-1 is none), SR-IOV links, netdevs, block
devices, vanished functions, address checks, and the fake kernel's reactions to writes."""

from __future__ import annotations

import errno
import os

import pytest

from cdiplug_backends.pci.sysfs import PciSysfs, check_address, check_driver, check_group
from cdiplug_backends.pci.testing import FakeSysfsKernel, SimulatedCrash, SysfsTree

from .conftest import add_nic_with_vfs


def test_reads_ids_class_driver_group_numa(tree: SysfsTree) -> None:
    tree.add_function(
        "0000:3b:00.0",
        vendor=0x8086,
        device=0x1572,
        subsystem_vendor=0x8086,
        subsystem_device=0x0007,
        class_code=0x020000,
        driver="i40e",
        iommu_group=5,
        numa_node=1,
        netdevs=["ens1f0"],
    )
    fn = PciSysfs(tree.root).read_function("0000:3b:00.0")
    assert fn is not None
    assert (fn.vendor, fn.device, fn.subsystem_vendor, fn.subsystem_device) == (0x8086, 0x1572, 0x8086, 0x0007)
    assert fn.class_code == 0x020000 and not fn.is_bridge
    assert (fn.driver, fn.iommu_group, fn.numa_node, fn.netdevs) == ("i40e", "5", 1, ("ens1f0",))
    assert fn.ids == "8086:1572"


def test_numa_minus_one_is_no_topology(tree: SysfsTree) -> None:
    tree.add_function("0000:00:02.0", numa_node=-1)
    assert PciSysfs(tree.root).read_function("0000:00:02.0").numa_node is None


def test_sriov_links_both_ways(tree: SysfsTree) -> None:
    vfs = add_nic_with_vfs(tree, vfs=3)
    topo = PciSysfs(tree.root).scan()
    pf = topo.functions["0000:3b:00.0"]
    assert pf.virtfns == tuple(vfs)
    for i, vf in enumerate(vfs):
        fn = topo.functions[vf]
        assert fn.physfn == "0000:3b:00.0" and fn.is_vf
        assert fn.iommu_group == str(40 + i) and fn.numa_node == 1 and fn.netdevs == (f"ens1f0v{i}",)


def test_group_members_and_bridges(tree: SysfsTree) -> None:
    tree.add_function("0000:00:1c.0", class_code=0x060400, driver="pcieport", iommu_group=7)
    tree.add_function("0000:01:00.0", vendor=0x10DE, device=0x1DB6, class_code=0x030200, iommu_group=7)
    tree.add_function("0000:01:00.1", vendor=0x10DE, device=0x10F2, class_code=0x040300, driver="snd_hda_intel", iommu_group=7)
    topo = PciSysfs(tree.root).scan()
    assert topo.group_members("7") == ("0000:00:1c.0", "0000:01:00.0", "0000:01:00.1")
    assert topo.functions["0000:00:1c.0"].is_bridge
    assert topo.functions["0000:01:00.0"].driver is None
    assert topo.group_members(None) == ()


def test_scan_of_empty_or_missing_tree(tmp_path) -> None:
    assert PciSysfs(tmp_path / "nothing").scan().functions == {}


def test_vanished_function_is_left_out(tree: SysfsTree) -> None:
    tree.add_function("0000:00:02.0")
    tree.add_function("0000:00:03.0")
    # A link whose target is gone: a function removed between listing and reading.
    tree.remove_function("0000:00:03.0")
    os.symlink("../../../devices/pci0000:00/0000:00:03.0", tree.devices / "0000:00:03.0")
    assert list(PciSysfs(tree.root).scan().functions) == ["0000:00:02.0"]


def test_block_devices_below_a_function(tree: SysfsTree) -> None:
    tree.add_function("0000:5e:00.0", vendor=0x144D, device=0xA808, class_code=0x010802, driver="nvme", iommu_group=9)
    tree.add_block("0000:5e:00.0", "nvme0n1", "259:0", partitions=[("nvme0n1p1", "259:1")])
    tree.add_function("0000:5f:00.0", class_code=0x010802, driver="nvme", iommu_group=10)
    sysfs = PciSysfs(tree.root)
    assert sysfs.block_devices("0000:5e:00.0") == [("nvme0n1", "259:0"), ("nvme0n1p1", "259:1")]
    assert sysfs.block_devices("0000:5f:00.0") == []
    tree.add_holder("nvme0n1p1", "dm-0")
    assert sysfs.block_holders("nvme0n1p1") == ["dm-0"]


@pytest.mark.parametrize("bad", ["../../etc", "0000:3b:02.0/..", "0000:3B:02.0", "3b:02.0", "0000:3b:02.8", ""])
def test_addresses_are_checked_before_becoming_paths(bad: str) -> None:
    with pytest.raises(ValueError, match="not a PCI address"):
        check_address(bad)


def test_group_and_driver_names_are_checked() -> None:
    assert check_group("12") == "12"
    assert check_driver("vfio-pci") == "vfio-pci"
    for bad in ("../1", "1/2", "x"):
        with pytest.raises(ValueError):
            check_group(bad)
    for bad in ("..", "a/b", ""):
        with pytest.raises(ValueError):
            check_driver(bad)


def test_noiommu_mode_and_group_names(tree: SysfsTree) -> None:
    sysfs = PciSysfs(tree.root)
    assert not sysfs.noiommu_enabled()
    tree.enable_vfio(noiommu=True)
    assert sysfs.noiommu_enabled()
    tree.add_function("0000:00:05.0")
    tree.set_iommu_group("0000:00:05.0", 3, name="vfio-noiommu")
    assert sysfs.scan().noiommu_groups == frozenset({"3"})


# -- the fake kernel ---------------------------------------------------------------------------------


def test_fake_kernel_binds_by_override_and_restores_netdevs(tree: SysfsTree) -> None:
    vf = add_nic_with_vfs(tree, vfs=1)[0]
    kernel = FakeSysfsKernel(tree)
    sysfs = PciSysfs(tree.root)
    kernel.write(sysfs.function_dir(vf) / "driver_override", "vfio-pci")
    kernel.write(sysfs.driver_dir("iavf") / "unbind", vf)
    assert sysfs.read_function(vf).netdevs == ()
    kernel.write(sysfs.drivers_probe, vf)
    assert tree.driver_of(vf) == "vfio-pci"
    assert (tree.dev_root / "dev" / "vfio" / "40").exists()
    kernel.write(sysfs.function_dir(vf) / "driver_override", "\n")
    kernel.write(sysfs.driver_dir("vfio-pci") / "unbind", vf)
    assert not (tree.dev_root / "dev" / "vfio" / "40").exists()
    kernel.write(sysfs.driver_dir("iavf") / "bind", vf)
    assert sysfs.read_function(vf).netdevs == ("ens1f0v0",)


def test_fake_kernel_errors_like_the_kernel(tree: SysfsTree) -> None:
    vf = add_nic_with_vfs(tree, vfs=1)[0]
    kernel = FakeSysfsKernel(tree)
    sysfs = PciSysfs(tree.root)
    with pytest.raises(OSError) as busy:
        kernel.write(sysfs.driver_dir("iavf") / "bind", vf)
    assert busy.value.errno == errno.EBUSY
    with pytest.raises(OSError) as nodev:
        kernel.write(sysfs.driver_dir("vfio-pci") / "unbind", vf)
    assert nodev.value.errno == errno.ENODEV
    with pytest.raises(AssertionError, match="never use new_id"):
        kernel.write(sysfs.driver_dir("vfio-pci") / "new_id", "8086 154c")
    kernel.fail["drivers_probe"] = errno.EIO
    with pytest.raises(OSError):
        kernel.write(sysfs.drivers_probe, vf)
    kernel.crash_after = 1
    with pytest.raises(SimulatedCrash):
        kernel.write(sysfs.function_dir(vf) / "driver_override", "vfio-pci")


# -- forged trees ------------------------------------------------------------


@pytest.mark.parametrize("group", ["..", "vfio", "5 ", "-1", "٣", "1e3", "x" * 300])
def test_an_iommu_group_that_is_no_plain_number_is_refused_with_a_reason(tree: SysfsTree, group: str, caplog) -> None:
    tree.add_function("0000:3b:00.0", iommu_group=5)
    link = tree.function_dir("0000:3b:00.0") / "iommu_group"
    target = tree.root / "kernel" / "iommu_groups" / group[:200]
    target.mkdir(parents=True, exist_ok=True)
    link.unlink()
    link.symlink_to(target if group != ".." else tree.root / "kernel" / "iommu_groups" / "..")
    topo = PciSysfs(tree.root).scan()
    fn = topo.functions["0000:3b:00.0"]
    assert fn.iommu_group is None and fn.problem is not None and "not a group number" in fn.problem
    assert topo.groups == {}
    assert "not advertised" in caplog.text and len(caplog.text) < 1000


@pytest.mark.parametrize("text", ["2147483648", "99999999999999999999", "-7", "banana", "1" * 4000])
def test_a_numa_node_out_of_range_or_no_number_is_unknown(tree: SysfsTree, text: str, caplog) -> None:
    tree.add_function("0000:00:02.0", numa_node=0)
    (tree.function_dir("0000:00:02.0") / "numa_node").write_text(text + "\n")
    assert PciSysfs(tree.root).read_function("0000:00:02.0").numa_node is None
    assert "NUMA node unknown" in caplog.text and len(caplog.text) < 1000


def test_a_fifo_in_a_forged_tree_does_not_block_the_scan(tree: SysfsTree) -> None:
    tree.add_function("0000:00:02.0", numa_node=0)
    numa = tree.function_dir("0000:00:02.0") / "numa_node"
    numa.unlink()
    os.mkfifo(numa)
    fn = PciSysfs(tree.root).read_function("0000:00:02.0")
    assert fn is not None and fn.numa_node is None
