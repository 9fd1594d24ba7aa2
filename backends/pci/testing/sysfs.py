"""Fake sysfs trees of PCI functions for unit tests, and a stand-in for the kernel's side of binding.

:class:`SysfsTree` lays out what the PCI backend reads, as Linux does: ``bus/pci/devices/<addr>``
links into ``devices/pci<domain>:<bus>/<addr>`` holding ``vendor``, ``device``, ``subsystem_*``,
``class``, ``numa_node``, ``driver_override``, a ``driver`` link into ``bus/pci/drivers/<name>``
(which links back), an ``iommu_group`` link into ``kernel/iommu_groups/<n>`` (whose ``devices/``
links back), SR-IOV ``physfn``/``virtfnN`` links and ``sriov_*vfs``, ``net/<ifname>`` (with
``class/net`` links), ``block/<disk>`` (with ``class/block`` links and ``dev``) and
``module/vfio/parameters/enable_unsafe_noiommu_mode``. Device nodes go under an optional ``dev``
root (``dev/vfio/vfio``, ``dev/vfio/<group>``) as plain files.

Files in a temporary folder cannot react to writes, so the tree itself is passive. Code that
binds drivers writes through a small writer object (``write(path, value)``); in tests pass a
:class:`FakeSysfsKernel`, which performs the write and then does what the kernel would:
``driver_override``, ``drivers/<d>/unbind`` and ``bind``, ``drivers_probe`` (override first,
else the function's default driver), creating and removing ``/dev/vfio/<group>`` (or
``noiommu-<group>`` with a made-up group in no-IOMMU mode), and netdevs that vanish while a NIC
is off its driver. It records every write (``writes``), refuses ``new_id`` like a reviewer would,
can fail a chosen write with an errno, and can "crash" (raise :class:`SimulatedCrash`, a
BaseException that no cleanup code catches) after a chosen write, to test journal recovery.
It can also feed a :class:`FakeUdevMonitor`, which looks like a started pyudev monitor.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path

from cdiplug.sdk import FakeUdevMonitor


class SimulatedCrash(BaseException):
    """Raised by :class:`FakeSysfsKernel` to stop the caller dead, as SIGKILL would."""


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _link(link: Path, target: Path) -> None:
    """A relative symlink, as sysfs has them."""
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(os.path.relpath(target, link.parent))


class SysfsTree:
    """Builds a fake sysfs tree under ``root`` (and device nodes under ``dev_root`` when given)."""

    def __init__(self, root: Path, dev_root: Path | None = None) -> None:
        self.root = Path(root)
        self.dev_root = Path(dev_root) if dev_root is not None else None
        self.devices = self.root / "bus" / "pci" / "devices"
        self.drivers = self.root / "bus" / "pci" / "drivers"
        self.groups = self.root / "kernel" / "iommu_groups"
        for folder in (self.devices, self.drivers, self.groups, self.root / "class" / "net", self.root / "class" / "block"):
            folder.mkdir(parents=True, exist_ok=True)
        for name in ("drivers_probe", "rescan"):
            _write(self.root / "bus" / "pci" / name, "")
        # What the kernel would bind without driver_override (drivers_probe), and netdevs of
        # functions whose driver is away: Python-side state the fake kernel uses.
        self.default_drivers: dict[str, str | None] = {}
        self.parked_netdevs: dict[str, list[tuple[str, str]]] = {}

    # -- building ---------------------------------------------------------------------------------

    def real_dir(self, address: str) -> Path:
        domain, bus, _ = address.split(":")
        return self.root / "devices" / f"pci{domain}:{bus}" / address

    def function_dir(self, address: str) -> Path:
        return self.devices / address

    def add_driver(self, name: str) -> Path:
        folder = self.drivers / name
        if not folder.is_dir():
            folder.mkdir(parents=True)
            for attr in ("bind", "unbind", "new_id", "remove_id"):
                _write(folder / attr, "")
        return folder

    def add_function(
        self,
        address: str,
        *,
        vendor: int = 0x8086,
        device: int = 0x1572,
        class_code: int = 0x020000,
        subsystem_vendor: int | None = None,
        subsystem_device: int | None = None,
        driver: str | None = None,
        iommu_group: int | str | None = None,
        numa_node: int = -1,
        netdevs: Iterable[str] = (),
    ) -> Path:
        real = self.real_dir(address)
        real.mkdir(parents=True, exist_ok=True)
        _write(real / "vendor", f"0x{vendor:04x}\n")
        _write(real / "device", f"0x{device:04x}\n")
        _write(real / "subsystem_vendor", f"0x{(subsystem_vendor if subsystem_vendor is not None else vendor):04x}\n")
        _write(real / "subsystem_device", f"0x{(subsystem_device if subsystem_device is not None else 0):04x}\n")
        _write(real / "class", f"0x{class_code:06x}\n")
        _write(real / "numa_node", f"{numa_node}\n")
        _write(real / "driver_override", "(null)\n")
        _link(self.function_dir(address), real)
        if iommu_group is not None:
            self.set_iommu_group(address, iommu_group)
        self.default_drivers[address] = driver
        if driver is not None:
            self.bind(address, driver)
        for name in netdevs:
            self.add_netdev(address, name)
        return real

    def set_iommu_group(self, address: str, group: int | str, name: str | None = None) -> None:
        folder = self.groups / str(group)
        (folder / "devices").mkdir(parents=True, exist_ok=True)
        if name is not None:
            _write(folder / "name", name + "\n")
        _link(self.real_dir(address) / "iommu_group", folder)
        _link(folder / "devices" / address, self.real_dir(address))

    def bind(self, address: str, driver: str) -> None:
        folder = self.add_driver(driver)
        _link(self.real_dir(address) / "driver", folder)
        _link(folder / address, self.real_dir(address))

    def unbind(self, address: str) -> str | None:
        link = self.real_dir(address) / "driver"
        if not link.is_symlink():
            return None
        driver = Path(os.readlink(link)).name
        link.unlink()
        back = self.drivers / driver / address
        if back.is_symlink():
            back.unlink()
        return driver

    def driver_of(self, address: str) -> str | None:
        link = self.real_dir(address) / "driver"
        return Path(os.readlink(link)).name if link.is_symlink() else None

    def driver_override(self, address: str) -> str | None:
        value = (self.real_dir(address) / "driver_override").read_text().strip()
        return None if value in ("", "(null)") else value

    def add_vfs(
        self,
        pf: str,
        addresses: Iterable[str],
        *,
        device: int = 0x154C,
        driver: str | None = None,
        first_group: int | None = None,
        netdev_prefix: str | None = None,
    ) -> list[str]:
        """SR-IOV VFs of ``pf`` (same vendor and NUMA node), each in its own group from ``first_group``."""
        pf_dir = self.real_dir(pf)
        vendor = int((pf_dir / "vendor").read_text(), 16)
        numa = int((pf_dir / "numa_node").read_text())
        added = []
        for i, vf in enumerate(addresses):
            self.add_function(
                vf,
                vendor=vendor,
                device=device,
                class_code=int((pf_dir / "class").read_text(), 16),
                driver=driver,
                iommu_group=None if first_group is None else first_group + i,
                numa_node=numa,
                netdevs=[f"{netdev_prefix}v{i}"] if netdev_prefix else [],
            )
            _link(self.real_dir(vf) / "physfn", pf_dir)
            _link(pf_dir / f"virtfn{i}", self.real_dir(vf))
            added.append(vf)
        count = len(added)
        _write(pf_dir / "sriov_numvfs", f"{count}\n")
        _write(pf_dir / "sriov_totalvfs", f"{max(count, 8)}\n")
        return added

    def add_netdev(self, address: str, name: str, operstate: str = "up") -> None:
        folder = self.real_dir(address) / "net" / name
        folder.mkdir(parents=True, exist_ok=True)
        _write(folder / "operstate", operstate + "\n")
        _link(self.root / "class" / "net" / name, folder)

    def remove_netdevs(self, address: str) -> list[tuple[str, str]]:
        net = self.real_dir(address) / "net"
        removed = []
        if net.is_dir():
            for folder in sorted(net.iterdir()):
                removed.append((folder.name, (folder / "operstate").read_text().strip()))
                (self.root / "class" / "net" / folder.name).unlink(missing_ok=True)
            shutil.rmtree(net)
        return removed

    def add_block(self, address: str, disk: str, dev: str, partitions: Iterable[tuple[str, str]] = ()) -> None:
        """A disk ``disk`` (``"259:0"``) below the function, with ``(name, dev)`` partitions."""
        folder = self.real_dir(address) / "nvme" / "nvme0" / disk
        _write(folder / "dev", dev + "\n")
        (folder / "holders").mkdir(exist_ok=True)
        _link(self.root / "class" / "block" / disk, folder)
        for name, part_dev in partitions:
            _write(folder / name / "dev", part_dev + "\n")
            (folder / name / "holders").mkdir(exist_ok=True)
            _link(self.root / "class" / "block" / name, folder / name)

    def add_holder(self, block: str, holder: str) -> None:
        (self.root / "class" / "block" / block / "holders").resolve().joinpath(holder).mkdir(parents=True, exist_ok=True)

    def set_numa_node(self, address: str, node: int) -> None:
        _write(self.real_dir(address) / "numa_node", f"{node}\n")

    def remove_function(self, address: str) -> None:
        self.unbind(address)
        group_link = self.real_dir(address) / "iommu_group"
        if group_link.is_symlink():
            (group_link.resolve() / "devices" / address).unlink(missing_ok=True)
        self.function_dir(address).unlink(missing_ok=True)
        shutil.rmtree(self.real_dir(address), ignore_errors=True)

    def enable_vfio(self, noiommu: bool = False, iommufd: bool = False) -> None:
        """Load vfio-pci: the driver folder, the module parameter, ``/dev/vfio/vfio`` (and ``/dev/iommu``)."""
        self.add_driver("vfio-pci")
        _write(self.root / "module" / "vfio" / "parameters" / "enable_unsafe_noiommu_mode", "Y\n" if noiommu else "N\n")
        if self.dev_root is not None:
            _write(self.dev_root / "dev" / "vfio" / "vfio", "")
            if iommufd:
                _write(self.dev_root / "dev" / "iommu", "")

    def group_node(self, group: str) -> Path | None:
        return None if self.dev_root is None else self.dev_root / "dev" / "vfio" / group


class FakeSysfsKernel:
    """Performs writes into a :class:`SysfsTree` and reacts to them as Linux would.

    ``fail`` maps a path suffix (``"drivers_probe"``, ``"ixgbevf/unbind"``) to an errno the write
    raises; ``crash_after`` is a number of writes after which the next write raises
    :class:`SimulatedCrash` (after it took effect, so recovery sees the step done) — or a
    predicate on ``(path, value)``. ``on_write`` is called after each write.
    """

    def __init__(self, tree: SysfsTree, udev: FakeUdevMonitor | None = None, iommufd: bool = False) -> None:
        self.tree = tree
        self.udev = udev
        self.iommufd = iommufd
        self.writes: list[tuple[str, str]] = []
        self.fail: dict[str, int] = {}
        self.crash_after: int | Callable[[str, str], bool] | None = None
        self.on_write: Callable[[str, str], None] | None = None
        self._next_group = 1000
        self._next_cdev = 0

    def write(self, path: Path, value: str) -> None:
        rel = str(Path(path).relative_to(self.tree.root))
        for suffix, code in self.fail.items():
            if rel.endswith(suffix):
                raise OSError(code, os.strerror(code), str(path))
        if not Path(path).exists():
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path))
        self.writes.append((rel, value))
        self._apply(rel, value.strip())
        if self.on_write is not None:
            self.on_write(rel, value)
        crash = self.crash_after
        if crash is not None and (crash(rel, value) if callable(crash) else len(self.writes) >= crash):
            raise SimulatedCrash(f"simulated crash after writing {value.strip()!r} to {rel}")

    # -- the kernel's side ------------------------------------------------------------------------

    def _apply(self, rel: str, value: str) -> None:
        parts = rel.split("/")
        tree = self.tree
        if parts[:3] == ["bus", "pci", "devices"] and parts[-1] == "driver_override":
            (tree.real_dir(parts[3]) / "driver_override").write_text((value or "(null)") + "\n")
        elif parts[:3] == ["bus", "pci", "drivers"] and parts[-1] == "unbind":
            if tree.driver_of(value) != parts[3]:
                raise OSError(errno.ENODEV, os.strerror(errno.ENODEV), rel)
            self._unbind(value)
        elif parts[:3] == ["bus", "pci", "drivers"] and parts[-1] == "bind":
            if tree.driver_of(value) is not None:
                raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), rel)
            override = tree.driver_override(value)
            if override is not None and override != parts[3]:
                raise OSError(errno.ENODEV, os.strerror(errno.ENODEV), rel)
            self._bind(value, parts[3])
        elif rel == "bus/pci/drivers_probe":
            if not tree.real_dir(value).is_dir():
                raise OSError(errno.ENODEV, os.strerror(errno.ENODEV), rel)
            if tree.driver_of(value) is None:
                driver = tree.driver_override(value) or tree.default_drivers.get(value)
                if driver is not None and (tree.drivers / driver).is_dir():
                    self._bind(value, driver)
        elif parts[-1] in ("new_id", "remove_id"):
            raise AssertionError(f"{rel} written: cdiplug must never use new_id/remove_id")

    def _group(self, address: str) -> str | None:
        link = self.tree.real_dir(address) / "iommu_group"
        return Path(os.readlink(link)).name if link.is_symlink() else None

    def _bind(self, address: str, driver: str) -> None:
        tree = self.tree
        if driver == "vfio-pci":
            group = self._group(address)
            node_name = group
            if group is None:
                noiommu = tree.root / "module" / "vfio" / "parameters" / "enable_unsafe_noiommu_mode"
                if not (noiommu.exists() and noiommu.read_text().strip() == "Y"):
                    raise OSError(errno.EINVAL, "no IOMMU group", address)
                group = str(self._next_group)
                self._next_group += 1
                tree.set_iommu_group(address, group, name="vfio-noiommu")
                node_name = f"noiommu-{group}"
            elif (tree.groups / group / "name").exists():
                node_name = f"noiommu-{group}"
            tree.bind(address, driver)
            if self.iommufd:
                # The kernel numbers vfio cdevs in bind order, one per bound function.
                (tree.real_dir(address) / "vfio-dev" / f"vfio{self._next_cdev}").mkdir(parents=True, exist_ok=True)
                self._next_cdev += 1
            if tree.dev_root is not None:
                _write(tree.dev_root / "dev" / "vfio" / str(node_name), "")
        else:
            tree.bind(address, driver)
            for name, operstate in tree.parked_netdevs.pop(address, []):
                tree.add_netdev(address, name, operstate)
        if self.udev is not None:
            self.udev.emit("bind", address)

    def _unbind(self, address: str) -> None:
        tree = self.tree
        driver = tree.unbind(address)
        if driver == "vfio-pci":
            shutil.rmtree(tree.real_dir(address) / "vfio-dev", ignore_errors=True)
            group = self._group(address)
            still = [a for a in (os.listdir(tree.groups / group / "devices") if group else []) if tree.driver_of(a) == "vfio-pci"]
            if group is not None and not still and tree.dev_root is not None:
                name = f"noiommu-{group}" if (tree.groups / group / "name").exists() else group
                (tree.dev_root / "dev" / "vfio" / name).unlink(missing_ok=True)
        else:
            parked = tree.remove_netdevs(address)
            if parked:
                tree.parked_netdevs[address] = parked
        if self.udev is not None:
            self.udev.emit("unbind", address)
