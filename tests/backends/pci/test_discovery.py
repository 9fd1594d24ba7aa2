"""What each resource advertises (cdiplug_backends.pci.discovery) from fake sysfs trees: every selector
field, first resource wins, the IOMMU group rule (whole_group, other resources, bridges), denylist
and force, SR-IOV PFs, functions without a group (noiommu), NUMA, device edits and the env name;
plus option errors through the real config loader."""

from __future__ import annotations

import pytest

from cdiplug.errors import ConfigError
from cdiplug.models.devices import DeviceNode
from cdiplug_backends.pci.discovery import Recorded, ids_env, select_all, to_snapshot
from cdiplug_backends.pci.sysfs import PciSysfs
from cdiplug_backends.pci.testing import SysfsTree

from .conftest import add_nic_with_vfs, resources


def select(tree: SysfsTree, *specs, recorded=None, noiommu=False):
    rs = resources(*specs)
    topo = PciSysfs(tree.root).scan()
    sel = select_all(topo, rs, recorded or {}, noiommu)
    return {r.name: to_snapshot(sel[r.name], r.options, topo, recorded or {}) for r in rs}, sel


def ids(snapshot) -> list[str]:
    return [d.id for d in snapshot.devices]


@pytest.fixture
def mixed(tree: SysfsTree) -> SysfsTree:
    add_nic_with_vfs(tree, vfs=2)
    tree.add_function("0000:3c:00.0", vendor=0x8086, device=0x1572, driver="i40e", iommu_group=6, numa_node=0, netdevs=["ens2f0"])
    tree.add_function(
        "0000:5e:00.0", vendor=0x144D, device=0xA808, class_code=0x010802, driver="nvme", iommu_group=9, numa_node=0
    )
    tree.add_function("0000:00:1c.0", device=0xA110, class_code=0x060400, driver="pcieport", iommu_group=7)
    tree.add_function("0000:01:00.0", vendor=0x10DE, device=0x1DB6, class_code=0x030200, iommu_group=7)
    tree.add_function("0000:01:00.1", vendor=0x10DE, device=0x10F2, class_code=0x040300, driver="snd_hda_intel", iommu_group=7)
    return tree


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ({"vendor": "0x8086", "device": "0x154c"}, ["0000:3b:02.0", "0000:3b:02.1"]),
        ({"vendor": "8086", "device": "1572"}, ["0000:3b:00.0", "0000:3c:00.0"]),
        ({"class": "0x010802"}, ["0000:5e:00.0"]),
        ({"class": "0x030000", "class_mask": "0xff0000"}, ["0000:01:00.0"]),
        ({"driver": "iavf"}, ["0000:3b:02.0", "0000:3b:02.1"]),
        ({"driver": "i40*"}, ["0000:3b:00.0", "0000:3c:00.0"]),
        ({"addresses": ["0000:3b:02.*", "0000:5E:00.0"]}, ["0000:3b:02.0", "0000:3b:02.1", "0000:5e:00.0"]),
        ({"pf": "ens1f0"}, ["0000:3b:02.0", "0000:3b:02.1"]),
        ({"pf": "ens2*"}, []),
        ({"netdev": "ens?f0"}, ["0000:3b:00.0", "0000:3c:00.0"]),
        ({"netdev": "ens1f0v1"}, ["0000:3b:02.1"]),
        ({"vendor": "0x8086", "driver": "nvme"}, []),
    ],
)
def test_selector_fields(mixed: SysfsTree, selector: dict, expected: list[str]) -> None:
    snaps, _ = select(mixed, ("example.com/dev", {"selectors": [selector]}))
    assert ids(snaps["example.com/dev"]) == expected


def test_any_selector_matches(mixed: SysfsTree) -> None:
    snaps, _ = select(mixed, ("example.com/dev", {"selectors": [{"class": "0x010802"}, {"pf": "ens1f0"}]}))
    assert ids(snaps["example.com/dev"]) == ["0000:3b:02.0", "0000:3b:02.1", "0000:5e:00.0"]


def test_first_resource_that_selects_wins(mixed: SysfsTree) -> None:
    snaps, _ = select(
        mixed,
        ("example.com/vf0", {"selectors": [{"addresses": ["0000:3b:02.0"]}]}),
        ("example.com/vfs", {"selectors": [{"pf": "ens1f0"}]}),
    )
    assert ids(snaps["example.com/vf0"]) == ["0000:3b:02.0"]
    assert ids(snaps["example.com/vfs"]) == ["0000:3b:02.1"]


def test_numa_node_and_no_topology(mixed: SysfsTree) -> None:
    snaps, _ = select(mixed, ("example.com/dev", {"selectors": [{"vendor": "0x8086"}, {"class": "0x030200"}]}))
    by_id = {d.id: d for d in snaps["example.com/dev"].devices}
    assert by_id["0000:3b:02.0"].numa_nodes == (1,)
    assert by_id["0000:3c:00.0"].numa_nodes == (0,)
    assert by_id["0000:01:00.0"].numa_nodes == ()


def test_vfio_edits_groups_and_env(mixed: SysfsTree) -> None:
    snaps, _ = select(mixed, ("example.com/nic-vfio", {"selectors": [{"pf": "ens1f0"}], "vfio": True}))
    snap = snaps["example.com/nic-vfio"]
    assert snap.common_edits.device_nodes == (DeviceNode(path="/dev/vfio/vfio"),)
    assert snap.ids_env == "PCI_RESOURCE_EXAMPLE_COM_NIC_VFIO"
    d = snap.get("0000:3b:02.1")
    assert d.edits.device_nodes == (DeviceNode(path="/dev/vfio/41"),) and not d.edits.env
    assert d.prepare_group == "41"
    assert d.attribute("physfn") == "0000:3b:00.0" and d.attribute("driver") == "iavf"
    assert d.attribute("vendor") == "0x8086" and d.attribute("device") == "0x154c"


def test_without_vfio_each_device_gets_an_env_var(mixed: SysfsTree) -> None:
    snaps, _ = select(mixed, ("example.com/nvme", {"selectors": [{"class": "0x010802"}]}))
    snap = snaps["example.com/nvme"]
    d = snap.get("0000:5e:00.0")
    assert dict(d.edits.env) == {"PCI_DEVICE_0000_5E_00_0": "0000:5e:00.0"}
    assert d.prepare_group is None and snap.common_edits.is_empty()


def test_ids_env_is_kubevirts_convention() -> None:
    assert ids_env("nvidia.com/GP102GL_Tesla-P40") == "PCI_RESOURCE_NVIDIA_COM_GP102GL_TESLA_P40"


def test_group_with_an_unselected_endpoint_is_skipped(mixed: SysfsTree) -> None:
    snaps, _ = select(mixed, ("example.com/gpu", {"selectors": [{"class": "0x030200"}], "vfio": True}))
    snap = snaps["example.com/gpu"]
    assert ids(snap) == []
    reason = dict(snap.skipped)["0000:01:00.0"]
    assert "IOMMU group 7 also holds 0000:01:00.1" in reason and "whole_group" in reason


def test_group_whose_endpoints_are_all_selected_is_advertised(mixed: SysfsTree) -> None:
    snaps, sel = select(mixed, ("example.com/gpu", {"selectors": [{"vendor": "0x10de"}], "vfio": True}))
    assert ids(snaps["example.com/gpu"]) == ["0000:01:00.0", "0000:01:00.1"]
    # The bridge in the group is left alone.
    assert sel["example.com/gpu"].group_members["7"] == ("0000:01:00.0", "0000:01:00.1")


def test_whole_group_takes_unselected_endpoints_along(mixed: SysfsTree) -> None:
    snaps, sel = select(mixed, ("example.com/gpu", {"selectors": [{"class": "0x030200"}], "vfio": True, "whole_group": True}))
    assert ids(snaps["example.com/gpu"]) == ["0000:01:00.0"]
    assert sel["example.com/gpu"].group_members["7"] == ("0000:01:00.0", "0000:01:00.1")


def test_whole_group_never_takes_another_resources_function(mixed: SysfsTree) -> None:
    snaps, _ = select(
        mixed,
        ("example.com/audio", {"selectors": [{"class": "0x040300"}]}),
        ("example.com/gpu", {"selectors": [{"class": "0x030200"}], "vfio": True, "whole_group": True}),
    )
    assert ids(snaps["example.com/audio"]) == ["0000:01:00.1"]
    assert "which resource example.com/audio selects" in dict(snaps["example.com/gpu"].skipped)["0000:01:00.0"]


def test_group_member_skipped_for_its_own_reason_skips_the_group(mixed: SysfsTree) -> None:
    snaps, _ = select(
        mixed, ("example.com/gpu", {"selectors": [{"vendor": "0x10de"}], "vfio": True, "denylist": ["0000:01:00.1"]})
    )
    skipped = dict(snaps["example.com/gpu"].skipped)
    assert skipped["0000:01:00.1"] == "on the denylist (0000:01:00.1)"
    assert "which is skipped: on the denylist" in skipped["0000:01:00.0"]


def test_denylist_and_force(mixed: SysfsTree) -> None:
    spec = {"selectors": [{"pf": "ens1f0"}], "vfio": True, "denylist": ["0000:3b:02.1"]}
    snaps, _ = select(mixed, ("example.com/vf", spec))
    assert ids(snaps["example.com/vf"]) == ["0000:3b:02.0"]
    snaps, _ = select(mixed, ("example.com/vf", {**spec, "force": True}))
    assert ids(snaps["example.com/vf"]) == ["0000:3b:02.0", "0000:3b:02.1"]


def test_vfio_skips_bridges_and_pfs_with_vfs(mixed: SysfsTree) -> None:
    snaps, _ = select(mixed, ("example.com/intel", {"selectors": [{"vendor": "0x8086"}], "vfio": True}))
    skipped = dict(snaps["example.com/intel"].skipped)
    assert "bridge" in skipped["0000:00:1c.0"]
    assert "SR-IOV physical function with 2 VFs" in skipped["0000:3b:00.0"]
    assert ids(snaps["example.com/intel"]) == ["0000:3b:02.0", "0000:3b:02.1", "0000:3c:00.0"]


def test_function_without_group(tree: SysfsTree) -> None:
    tree.add_function("0000:00:05.0", vendor=0x1AF4, device=0x1041, driver="virtio-pci")
    spec = ("example.com/virtio", {"selectors": [{"vendor": "0x1af4"}], "vfio": True})
    snaps, _ = select(tree, spec)
    assert "no IOMMU group" in dict(snaps["example.com/virtio"].skipped)["0000:00:05.0"]
    snaps, _ = select(tree, ("example.com/virtio", {**spec[1], "noiommu": True}))
    assert "enable_unsafe_noiommu_mode is off" in dict(snaps["example.com/virtio"].skipped)["0000:00:05.0"]
    snaps, _ = select(tree, ("example.com/virtio", {**spec[1], "noiommu": True}), noiommu=True)
    d = snaps["example.com/virtio"].get("0000:00:05.0")
    assert d.prepare_group == "noiommu:0000:00:05.0"
    assert dict(d.edits.env) == {"PCI_DEVICE_0000_00_05_0": "0000:00:05.0"}  # its node exists only once bound


def test_noiommu_group_node(tree: SysfsTree) -> None:
    tree.enable_vfio(noiommu=True)
    tree.add_function("0000:00:05.0", driver="vfio-pci")
    tree.set_iommu_group("0000:00:05.0", 0, name="vfio-noiommu")
    snaps, _ = select(
        tree, ("example.com/virtio", {"selectors": [{"addresses": ["0000:00:05.0"]}], "vfio": True, "noiommu": True})
    )
    assert snaps["example.com/virtio"].get("0000:00:05.0").edits.device_nodes == (DeviceNode(path="/dev/vfio/noiommu-0"),)


def test_driver_and_netdev_selectors_follow_the_recorded_original(mixed: SysfsTree) -> None:
    vf = "0000:3b:02.0"
    mixed.unbind(vf)
    mixed.remove_netdevs(vf)
    mixed.bind(vf, "vfio-pci")
    recorded = {vf: Recorded("iavf", ("ens1f0v0",))}
    for selector in ({"driver": "iavf"}, {"netdev": "ens1f0v0"}):
        snaps, _ = select(mixed, ("example.com/vf", {"selectors": [selector], "vfio": True}), recorded=recorded)
        d = snaps["example.com/vf"].get(vf)
        assert d is not None, selector
        assert d.attribute("driver") == "vfio-pci" and d.attribute("original_driver") == "iavf"
    snaps, _ = select(mixed, ("example.com/vf", {"selectors": [{"driver": "iavf"}], "vfio": True}))
    assert vf not in snaps["example.com/vf"]  # without the record it no longer matches


@pytest.mark.parametrize(
    ("options", "message", "where"),
    [
        ({}, "at least one selector is needed", "options.selectors"),
        ({"selectors": [{}]}, "a selector needs at least one of", "options.selectors[0]"),
        ({"selectors": [{"vendor": "zz"}]}, "hexadecimal PCI ID", "options.selectors[0].vendor"),
        ({"selectors": [{"vendor": 32902}]}, "expected a string", "options.selectors[0].vendor"),
        ({"selectors": [{"class": "0x1234567"}]}, "hexadecimal PCI class", "options.selectors[0].class"),
        ({"selectors": [{"vendor": "1", "class_mask": "0xff"}]}, "class_mask needs class", "options.selectors[0].class_mask"),
        ({"selectors": [{"addresses": ["0000:00/01"]}]}, "not a PCI address glob", "options.selectors[0].addresses[0]"),
        ({"selectors": [{"vendor": "1", "bogus": 1}]}, "bogus", "options.selectors[0]"),
        ({"selectors": [{"vendor": "1"}], "release": "restore"}, "needs vfio: true", "options.release"),
        ({"selectors": [{"vendor": "1"}], "release": "later"}, "expected one of 'keep', 'restore'", "options.release"),
        ({"selectors": [{"vendor": "1"}], "rescan_interval": 0}, "more than 0", "options.rescan_interval"),
        ({"selectors": [{"vendor": "1"}], "denylist": ["../x"]}, "not a PCI address glob", "options.denylist[0]"),
    ],
)
def test_option_errors_name_the_field(options: dict, message: str, where: str) -> None:
    with pytest.raises(ConfigError) as err:
        resources(("example.com/dev", options))
    assert message in err.value.message
    assert err.value.path == f"$.resources[0].{where}"
    assert err.value.source == "test.yaml"


def test_typed_attributes_for_dra(mixed: SysfsTree) -> None:
    snaps, _ = select(mixed, ("example.com/nvme", {"selectors": [{"class": "0x010802"}]}))
    (device,) = snaps["example.com/nvme"].devices
    assert device.attribute("vendor") == "0x144d" and device.attribute("driver") == "nvme"
    assert device.attribute("address") == "0000:5e:00.0"
    assert device.attribute("numa_node") == 0  # an int: CEL compares it as a number
    assert device.attribute("resource.kubernetes.io/pcieRoot") == "pci0000:5e"
    assert device.attribute("resource.kubernetes.io/pciBusID") == "0000:5e:00.0"  # the standard name KubeVirt reads
