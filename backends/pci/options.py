"""The PCI backend's per-resource options, as the config file spells them.

```yaml
options:
  selectors:                       # a function is selected when ANY selector matches it;
    - {vendor: "0x8086", device: "0x154c"}   # a selector matches when ALL its fields do
    - {class: "0x020000", class_mask: "0xffff00", driver: "ixgbe*"}
    - {addresses: ["0000:3b:02.*"]}
    - {pf: "ens1f0"}               # the SR-IOV VFs of the PF whose interface is ens1f0
    - {netdev: "eth*"}             # functions that carry a network interface of that name
  vfio: true                       # bind to vfio-pci at Allocate
  whole_group: false               # take IOMMU group members that no resource selects
  force: false                     # bind even when in use or on the denylist
  denylist: ["0000:00:1f.*"]       # address globs never bound
  release: keep                    # or restore: back to the original driver once no pod holds it
```

Only value checks live here (``problems()``); what a selector means is ``discovery``'s business.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterator
from pathlib import Path

from attrs import frozen
from cattrs.gen import make_dict_structure_fn, override

from cdiplug.sdk import CheckedOptions, converter, register_enum

_HEX_ID = re.compile(r"^(0x)?[0-9a-fA-F]{1,4}$")
_HEX_CLASS = re.compile(r"^(0x)?[0-9a-fA-F]{1,6}$")
_NAME_GLOB = re.compile(r"^[A-Za-z0-9_.:*?\[\]!-]+$")


class Release(str, enum.Enum):
    """What happens to a bound function once no pod holds it."""

    KEEP = "keep"  # stays on vfio-pci, ready for the next pod
    RESTORE = "restore"  # goes back to the driver it had before cdiplug bound it


register_enum(Release)


def parse_hex(value: str) -> int:
    return int(value, 16)


@frozen
class Selector:
    """One way of picking PCI functions; every field that is set must match."""

    vendor: str | None = None  # PCI vendor ID, quoted hexadecimal ("0x8086")
    device: str | None = None  # PCI device ID, quoted hexadecimal ("0x154c")
    class_: str | None = None  # PCI class, quoted hexadecimal ("0x020000"); with class_mask, the bits compared
    class_mask: str | None = None  # which bits of the class to compare ("0xffff00": class and subclass)
    driver: str | None = None  # glob over the function's driver (the one before cdiplug bound it)
    addresses: tuple[str, ...] = ()  # globs over PCI addresses, domain included ("0000:3b:02.*")
    pf: str | None = None  # the SR-IOV VFs of the PF whose network interface matches this glob
    netdev: str | None = None  # functions carrying a network interface whose name matches this glob

    def problems(self, at: str) -> Iterator[tuple[str, str]]:
        if not any((self.vendor, self.device, self.class_, self.driver, self.addresses, self.pf, self.netdev)):
            yield at, "a selector needs at least one of vendor, device, class, driver, addresses, pf, netdev"
        for name, value in (("vendor", self.vendor), ("device", self.device)):
            if value is not None and not _HEX_ID.match(value):
                yield f"{at}.{name}", f'expected a hexadecimal PCI ID such as "0x8086", got {value!r}'
        for name, value in (("class", self.class_), ("class_mask", self.class_mask)):
            if value is not None and not _HEX_CLASS.match(value):
                yield f"{at}.{name}", f'expected a hexadecimal PCI class such as "0x020000", got {value!r}'
        if self.class_mask is not None and self.class_ is None:
            yield f"{at}.class_mask", "class_mask needs class"
        for i, glob in enumerate(self.addresses):
            if not _NAME_GLOB.match(glob):
                yield f"{at}.addresses[{i}]", f"not a PCI address glob: {glob!r}"
        for name, value in (("driver", self.driver), ("pf", self.pf), ("netdev", self.netdev)):
            if value is not None and not _NAME_GLOB.match(value):
                yield f"{at}.{name}", f"not a name or glob: {value!r}"

    @property
    def class_value(self) -> tuple[int, int] | None:
        """(class, mask) for matching, or None when the selector does not look at the class."""
        if self.class_ is None:
            return None
        mask = parse_hex(self.class_mask) if self.class_mask is not None else 0xFFFFFF
        return parse_hex(self.class_) & mask, mask


# "class" is a Python keyword: the attribute is class_, the config key is class.
converter.register_structure_hook(
    Selector,
    make_dict_structure_fn(Selector, converter, _cattrs_forbid_extra_keys=True, class_=override(rename="class")),
)


@frozen
class PciOptions(CheckedOptions):
    """Options of one resource served by the PCI backend (see the module docstring)."""

    selectors: tuple[Selector, ...] = ()
    vfio: bool = False
    whole_group: bool = False
    force: bool = False
    denylist: tuple[str, ...] = ()
    release: Release = Release.KEEP
    # A just-bound function may not show in PodResources yet (the kubelet records the allocation
    # after our Allocate answer), so restoring waits this long after a bind.
    release_grace: float = 60.0
    release_interval: float = 30.0  # seconds between looks for bound functions that no pod holds any more
    link_health: bool = False  # a function whose network link is down is Unhealthy (netlink)
    noiommu: bool = False  # accept vfio's no-IOMMU mode (unsafe: no isolation) on nodes without an IOMMU
    rescan_interval: float = 30.0  # seconds between sysfs scans (besides hotplug events)
    mountinfo: Path = Path("/proc/self/mountinfo")  # where mounts are read, to refuse a function whose disk is mounted
    proc_root: Path = Path("/proc")  # where processes are read, to refuse a function a process holds open

    def problems(self) -> Iterator[tuple[str, str]]:
        if not self.selectors:
            yield "selectors", "at least one selector is needed"
        for i, selector in enumerate(self.selectors):
            yield from selector.problems(f"selectors[{i}]")
        for i, glob in enumerate(self.denylist):
            if not _NAME_GLOB.match(glob):
                yield f"denylist[{i}]", f"not a PCI address glob: {glob!r}"
        for name in ("release_grace", "release_interval", "rescan_interval"):
            value = getattr(self, name)
            if not 0 < value <= 86400:
                yield name, f"must be more than 0 and at most 86400 seconds, got {value:g}"
        if self.release is Release.RESTORE and not self.vfio:
            yield "release", "release: restore needs vfio: true (only bound functions are restored)"
        if self.noiommu and not self.vfio:
            yield "noiommu", "noiommu needs vfio: true"
