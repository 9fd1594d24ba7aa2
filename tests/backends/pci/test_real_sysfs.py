"""Discovery against this machine's own /sys (real sysfs; the CI VMs have virtio PCI functions): what
the backend reads is compared with what the test reads from /sys by itself, and the backend runs
for real with its pyudev netlink monitor on the event loop. Nothing is written to /sys."""

from __future__ import annotations

import os
from pathlib import Path

import attrs
import pytest

from cdiplug.models.world import World
from cdiplug_backends.pci.sysfs import PciSysfs

from .conftest import make_backend, running

SYS = Path("/sys")
DEVICES = SYS / "bus" / "pci" / "devices"


def read_independently(address: str) -> dict:
    d = DEVICES / address
    link = lambda name: os.path.basename(os.readlink(d / name)) if (d / name).is_symlink() else None  # noqa: E731
    numa = int((d / "numa_node").read_text()) if (d / "numa_node").exists() else -1
    return {
        "vendor": int((d / "vendor").read_text(), 16),
        "device": int((d / "device").read_text(), 16),
        "class_code": int((d / "class").read_text(), 16),
        "driver": link("driver"),
        "iommu_group": link("iommu_group"),
        "numa_node": numa if numa >= 0 else None,
        "netdevs": tuple(sorted(os.listdir(d / "net"))) if (d / "net").is_dir() else (),
    }


@pytest.fixture(scope="module")
def addresses() -> list[str]:
    found = sorted(os.listdir(DEVICES)) if DEVICES.is_dir() else []
    assert found, "this machine shows no PCI functions in /sys/bus/pci/devices: the test needs a VM with some (virtio)"
    return found


def test_scan_matches_what_sysfs_says(addresses: list[str]) -> None:
    topology = PciSysfs(SYS).scan()
    assert sorted(topology.functions) == addresses
    for address in addresses:
        expected = read_independently(address)
        read = attrs.asdict(topology.functions[address], filter=lambda a, v, names=set(expected): a.name in names)
        assert read == expected, address


def test_iommu_groups_match_kernel_iommu_groups(addresses: list[str]) -> None:
    topology = PciSysfs(SYS).scan()
    groups_dir = SYS / "kernel" / "iommu_groups"
    expected = {
        g: tuple(sorted(os.listdir(groups_dir / g / "devices")))
        for g in (os.listdir(groups_dir) if groups_dir.is_dir() else [])
        if any(a in addresses for a in os.listdir(groups_dir / g / "devices"))
    }
    assert {g: tuple(sorted(m)) for g, m in topology.groups.items()} == expected


async def test_backend_advertises_the_selected_functions(world: World, addresses: list[str]) -> None:
    # The vendor of the first function that is not a bridge (virtio's 0x1af4 on the CI VMs).
    first = next(
        (i for i in map(read_independently, addresses) if i["class_code"] >> 16 != 0x06), read_independently(addresses[0])
    )
    vendor = f"0x{first['vendor']:04x}"
    expected = [a for a in addresses if read_independently(a)["vendor"] == first["vendor"]]
    real = attrs.evolve(world, sysfs_root=SYS)
    specs = [
        ("example.com/vfio", {"selectors": [{"vendor": vendor}], "vfio": True}),
        ("example.com/plain", {"selectors": [{"vendor": vendor}]}),
    ]
    backend = make_backend(real, specs)
    async with running(backend) as sink:
        vfio, plain = sink.latest["example.com/vfio"], sink.latest["example.com/plain"]
    # The first resource selects them all; in VFIO mode a function needs a group whose other
    # endpoints it can take, else it is skipped with the reason.
    assert sorted([*vfio.ids, *(a for a, _ in vfio.skipped)]) == expected
    assert plain.devices == ()
    for address, reason in vfio.skipped:
        info = read_independently(address)
        if info["class_code"] >> 8 in (0x0600, 0x0604, 0x0607, 0x0609):
            assert reason.startswith("a bridge"), (address, reason)
        elif info["iommu_group"] is None:
            assert reason.startswith("no IOMMU group"), (address, reason)
        else:
            assert "IOMMU group" in reason or "SR-IOV" in reason, (address, reason)
    for device in vfio.devices:
        info = read_independently(device.id)
        assert device.prepare_group == info["iommu_group"]
        assert device.numa_nodes == ((info["numa_node"],) if info["numa_node"] is not None else ())
        assert device.attribute("driver") == (info["driver"] or "")


async def test_the_real_udev_monitor_is_opened_on_real_sysfs(world: World, addresses: list[str]) -> None:
    real = attrs.evolve(world, sysfs_root=SYS)
    backend = make_backend(real, [("example.com/any", {"selectors": [{"addresses": ["*"]}]})])
    monitor = backend._open_monitor()
    assert monitor is not None and monitor.fileno() >= 0
    async with running(backend) as sink:
        assert sorted(sink.latest["example.com/any"].ids) == addresses
