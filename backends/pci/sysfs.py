"""Reading PCI functions out of sysfs (under ``--sysfs-root``): the one place that knows its layout.

For each function in ``bus/pci/devices``: vendor, device and subsystem IDs, class, bound driver,
IOMMU group, NUMA node (``-1`` means the platform has no topology: reported as None), SR-IOV links
(``physfn``, ``virtfnN``), network interfaces (``net/``) and the VFIO character device of iommufd
(``vfio-dev/vfioN``). Nothing here writes; binding lives in ``vfio``.

What sysfs says is checked before it is used: a tree may be forged (a container with a writable
``--sysfs-root``, a test). An IOMMU group whose link does not end in a plain number is refused
with a reason (:attr:`PciFunction.problem`: the function is never advertised), so ``/dev/vfio/..``
can never reach a spec or a DeviceSpec; a NUMA node outside 0..2^31-1 is unknown (logged);
attribute files are read at most 4 KiB, never blocking on a FIFO.

Reading is blocking and meant for ``asyncio.to_thread``. It uses bare ``os`` calls because a scan of
thousands of functions must stay well under a second. A function that vanishes mid-scan (hot
unplug) is simply left out. Every path built from an address is checked first, so an address can
never leave ``bus/pci/devices``.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path

from attrs import field, frozen

from cdiplug.sdk import MAX_NUMA_NODE, BackendError, brief

log = logging.getLogger(__name__)


_ADDRESS = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_GROUP = re.compile(r"^[0-9]+$")
_DRIVER = re.compile(r"^[A-Za-z0-9_.:+-]+$")

# Classes of functions that VFIO leaves with their host driver: bridges (host, PCI-to-PCI,
# CardBus, subtractive-decode PCI). Everything else in a group is an endpoint.
_BRIDGE_CLASSES = frozenset({0x0600, 0x0604, 0x0607, 0x0609})


class SysfsError(BackendError):
    """sysfs could not be read where it must be (no ``bus/pci`` at all, say)."""


def check_address(address: str) -> str:
    """``address`` if it is a PCI address in sysfs spelling (``0000:3b:02.0``), else ValueError."""
    if not _ADDRESS.match(address):
        raise ValueError(f"not a PCI address (expected DDDD:BB:DD.F, lower-case hex): {address!r}")
    return address


def is_address(address: str) -> bool:
    return bool(_ADDRESS.match(address))


def check_group(group: str) -> str:
    if not _GROUP.match(group):
        raise ValueError(f"not an IOMMU group: {group!r}")
    return group


def check_driver(name: str) -> str:
    if not _DRIVER.match(name) or name in (".", ".."):
        raise ValueError(f"not a driver name: {name!r}")
    return name


@frozen
class PciFunction:
    """One PCI function as sysfs shows it at one moment."""

    address: str
    vendor: int
    device: int
    subsystem_vendor: int | None = None
    subsystem_device: int | None = None
    class_code: int = 0
    driver: str | None = None
    iommu_group: str | None = None
    numa_node: int | None = None
    physfn: str | None = None
    virtfns: tuple[str, ...] = field(default=(), converter=tuple[str, ...])
    netdevs: tuple[str, ...] = field(default=(), converter=tuple[str, ...])
    vfio_dev: str | None = None
    pcie_root: str | None = None  # the root complex the function hangs off (``pci0000:00``), for DRA
    # Why sysfs' account of this function cannot be trusted (an IOMMU group that is no number):
    # such a function is never advertised.
    problem: str | None = None

    @property
    def is_bridge(self) -> bool:
        return (self.class_code >> 8) in _BRIDGE_CLASSES

    @property
    def ids(self) -> str:
        return f"{self.vendor:04x}:{self.device:04x}"

    @property
    def is_vf(self) -> bool:
        return self.physfn is not None


@frozen
class PciTopology:
    """Every function found by one scan, and the members of each IOMMU group."""

    functions: Mapping[str, PciFunction]
    groups: Mapping[str, tuple[str, ...]]
    # Groups vfio made up for a function without an IOMMU (no-IOMMU mode): their device node is
    # /dev/vfio/noiommu-<group>.
    noiommu_groups: frozenset[str] = frozenset()

    def group_members(self, group: str | None) -> tuple[str, ...]:
        return self.groups.get(group, ()) if group is not None else ()


def _numa(address: str, text: str | None) -> int | None:
    """The NUMA node in ``text``; None when unknown (-1, missing, not a number, out of range)."""
    if text is None or text == "-1":
        return None
    if len(text) > 12 or not text.lstrip("-").isdigit():
        log.warning("PCI function %s: numa_node holds %s, not a number; NUMA node unknown", address, brief(text))
        return None
    node = int(text)
    if not 0 <= node <= MAX_NUMA_NODE:
        log.warning("PCI function %s: NUMA node %d is out of range 0..%d; NUMA node unknown", address, node, MAX_NUMA_NODE)
        return None
    return node


def _read(path: str) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, 4096).decode("ascii", "replace").strip()
    except OSError:
        return None
    finally:
        os.close(fd)


def _hex(text: str | None) -> int | None:
    if not text:
        return None
    try:
        return int(text, 16)
    except ValueError:
        return None


_PCIE_ROOT = re.compile(r"pci[0-9a-f]{4}:[0-9a-f]{2}")


def pcie_root(function_dir: str) -> str | None:
    """The PCIe root complex of a function (``pci0000:00``) from its real sysfs path, or None."""
    real = os.path.realpath(function_dir)
    return next((part for part in real.split(os.sep) if _PCIE_ROOT.fullmatch(part)), None)


def _link_name(path: str) -> str | None:
    try:
        return os.path.basename(os.readlink(path))
    except OSError:
        return None


class PciSysfs:
    """PCI functions under one sysfs root."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.devices_dir = self.root / "bus" / "pci" / "devices"
        self.drivers_dir = self.root / "bus" / "pci" / "drivers"
        self._devices = str(self.devices_dir)

    # -- paths (every one built from a checked name) ------------------------------------------

    def function_dir(self, address: str) -> Path:
        return self.devices_dir / check_address(address)

    def driver_dir(self, name: str) -> Path:
        return self.drivers_dir / check_driver(name)

    @property
    def drivers_probe(self) -> Path:
        return self.root / "bus" / "pci" / "drivers_probe"

    def noiommu_enabled(self) -> bool:
        value = _read(str(self.root / "module" / "vfio" / "parameters" / "enable_unsafe_noiommu_mode"))
        return value in ("Y", "1")

    def driver_loaded(self, name: str) -> bool:
        return self.driver_dir(name).is_dir()

    # -- reading --------------------------------------------------------------------------------

    def addresses(self) -> list[str]:
        try:
            names = os.listdir(self._devices)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise SysfsError(f"cannot list {self._devices}: {exc.strerror}") from exc
        return sorted(n for n in names if _ADDRESS.match(n))

    def read_function(self, address: str) -> PciFunction | None:
        """The function at ``address``, or None when it is not there (or vanished while reading)."""
        base = os.path.join(self._devices, check_address(address))
        try:
            entries = os.listdir(base)
        except OSError:
            return None
        present = set(entries)
        values = {name: _read(f"{base}/{name}") for name in ("vendor", "device", "class")}
        vendor, device = _hex(values["vendor"]), _hex(values["device"])
        if vendor is None or device is None:
            return None
        numa = _numa(address, _read(f"{base}/numa_node") if "numa_node" in present else None)
        problem = None
        group = _link_name(f"{base}/iommu_group") if "iommu_group" in present else None
        if group is not None and not _GROUP.match(group):
            problem = f"its IOMMU group link names {brief(group)}, not a group number"
            log.warning("PCI function %s: %s; it is not advertised", address, problem)
            group = None
        virtfns = [e for e in entries if e.startswith("virtfn")]
        vf_links = sorted(
            ((int(e[6:]), _link_name(f"{base}/{e}")) for e in virtfns if e[6:].isdigit()),
        )
        netdevs: tuple[str, ...] = ()
        if "net" in present:
            try:
                netdevs = tuple(sorted(os.listdir(f"{base}/net")))
            except OSError:
                netdevs = ()
        vfio_dev = None
        if "vfio-dev" in present:
            try:
                vfio_dev = next(
                    (n for n in sorted(os.listdir(f"{base}/vfio-dev")) if n.startswith("vfio") and n[4:].isdigit()), None
                )
            except OSError:
                vfio_dev = None
        return PciFunction(
            address=address,
            vendor=vendor,
            device=device,
            subsystem_vendor=_hex(_read(f"{base}/subsystem_vendor")) if "subsystem_vendor" in present else None,
            subsystem_device=_hex(_read(f"{base}/subsystem_device")) if "subsystem_device" in present else None,
            class_code=_hex(values["class"]) or 0,
            driver=_link_name(f"{base}/driver") if "driver" in present else None,
            iommu_group=group,
            numa_node=numa,
            physfn=_link_name(f"{base}/physfn") if "physfn" in present else None,
            virtfns=tuple(name for _, name in vf_links if name),
            netdevs=netdevs,
            vfio_dev=vfio_dev,
            pcie_root=pcie_root(base),
            problem=problem,
        )

    def read_driver_override(self, address: str) -> str | None:
        value = _read(str(self.function_dir(address) / "driver_override"))
        return None if value in (None, "", "(null)") else value

    def scan(self) -> PciTopology:
        """Every function under ``bus/pci/devices`` and the IOMMU groups they form."""
        functions: dict[str, PciFunction] = {}
        groups: dict[str, list[str]] = {}
        for address in self.addresses():
            function = self.read_function(address)
            if function is None:
                continue
            functions[address] = function
            if function.iommu_group is not None:
                groups.setdefault(function.iommu_group, []).append(address)
        # Only vfio in no-IOMMU mode makes such groups: skip a read per group otherwise.
        noiommu = frozenset(g for g in groups if self.group_is_noiommu(g)) if self.noiommu_enabled() else frozenset()
        return PciTopology(functions=functions, groups={g: tuple(m) for g, m in groups.items()}, noiommu_groups=noiommu)

    def group_is_noiommu(self, group: str) -> bool:
        """vfio names the groups it makes for no-IOMMU mode ``vfio-noiommu``."""
        return _read(str(self.root / "kernel" / "iommu_groups" / check_group(group) / "name")) == "vfio-noiommu"

    def block_devices(self, address: str) -> list[tuple[str, str]]:
        """``(name, "major:minor")`` of every block device (disks and partitions) below the function."""
        function_path = os.path.realpath(self.function_dir(address)) + os.sep
        class_block = self.root / "class" / "block"
        found = []
        try:
            names = os.listdir(class_block)
        except OSError:
            return []
        for name in sorted(names):
            real = os.path.realpath(class_block / name)
            if real.startswith(function_path):
                dev = _read(f"{real}/dev")
                if dev:
                    found.append((name, dev))
        return found

    def block_holders(self, name: str) -> list[str]:
        """Devices stacked on a block device (device-mapper, md): ``class/block/<name>/holders``."""
        try:
            return sorted(os.listdir(self.root / "class" / "block" / name / "holders"))
        except OSError:
            return []
