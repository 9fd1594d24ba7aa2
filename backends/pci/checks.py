"""What the PCI backend needs of a node, for ``cdiplug doctor`` and ``cdiplug discover``.

When a resource binds to vfio-pci: the IOMMU (``<sysfs>/kernel/iommu_groups`` not empty;
``<sysfs>/class/iommu`` names the units), the vfio-pci driver and ``/dev/vfio/vfio``; always,
and each resource's options against what a scan found: an address glob without its PCI domain
(``3b:02.0`` matches nothing: sysfs says ``0000:3b:02.0``) and a selector that matches no function.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import attrs

from cdiplug.sdk import Finding, ResourceConfig, Verdict, World

from .discovery import Recorded, selects
from .options import PciOptions
from .sysfs import PciSysfs, PciTopology

IOMMU_FIX = (
    "turn the IOMMU on in the firmware (VT-d or AMD-Vi) and on the kernel command line "
    "(intel_iommu=on or amd_iommu=on, with iommu=pt), then reboot"
)
VFIO_FIX = "load it: modprobe vfio-pci (and name it in /etc/modules-load.d/vfio-pci.conf to load it at every boot)"


def _listing(sysfs: PciSysfs, *parts: str) -> list[str]:
    try:
        return sorted(p.name for p in sysfs.root.joinpath(*parts).iterdir())
    except OSError:
        return []


def node_findings(sysfs: PciSysfs, world: World, resources: Sequence[ResourceConfig[PciOptions]]) -> Iterator[Finding]:
    """The IOMMU and VFIO, when a resource binds to vfio-pci (``noiommu``: no IOMMU needed)."""
    if not any(r.options.vfio for r in resources):
        yield Finding("VFIO", Verdict.OK, "not needed: no resource binds to vfio-pci")
        return
    groups = _listing(sysfs, "kernel", "iommu_groups")
    units = _listing(sysfs, "class", "iommu")
    if groups:
        yield Finding("IOMMU", Verdict.OK, f"{len(groups)} IOMMU groups ({', '.join(units) or 'no units listed'})")
    else:
        noiommu = all(r.options.noiommu for r in resources if r.options.vfio)
        where = f"{sysfs.root}/kernel/iommu_groups"
        yield Finding(
            "IOMMU",
            Verdict.WARNING if noiommu else Verdict.PROBLEM,
            f"no IOMMU groups under {where}: the IOMMU is off, so vfio-pci cannot isolate a device"
            + (" (noiommu: true accepts that)" if noiommu else ""),
            IOMMU_FIX,
        )
    if not sysfs.driver_loaded("vfio-pci"):
        yield Finding("vfio-pci", Verdict.PROBLEM, "the vfio-pci driver is not loaded", VFIO_FIX)
        return
    yield Finding("vfio-pci", Verdict.OK, "the vfio-pci driver is loaded")
    node = world.host_path("/dev/vfio/vfio")
    if node.exists():
        yield Finding("VFIO container", Verdict.OK, f"{node} is there")
    else:
        yield Finding(
            "VFIO container", Verdict.PROBLEM, f"no {node}", "in a pod, mount the host's /dev (vfio-pci makes the node)"
        )


def _without_domain(glob: str) -> bool:
    return glob.count(":") == 1


def option_findings(
    resources: Sequence[ResourceConfig[PciOptions]], topology: PciTopology, recorded: Mapping[str, Recorded]
) -> Iterator[Finding]:
    """Address globs without their domain, and selectors that match no function of ``topology``."""
    for r in resources:
        places = [
            (f"options.selectors[{i}].addresses[{j}]", g)
            for i, s in enumerate(r.options.selectors)
            for j, g in enumerate(s.addresses)
        ]
        places += [(f"options.denylist[{j}]", g) for j, g in enumerate(r.options.denylist)]
        for field, glob in places:
            if _without_domain(glob):
                yield Finding(
                    "PCI address",
                    Verdict.WARNING,
                    f"{glob!r} has no PCI domain, so it matches no function (sysfs names them 0000:{glob})",
                    f"write {'0000:' + glob!r}",
                    resource=r.name,
                    field=field,
                )
        for i, selector in enumerate(r.options.selectors):
            one = attrs.evolve(r.options, selectors=(selector,))
            if not any(selects(one, fn, topology, recorded.get(a)) for a, fn in topology.functions.items()):
                yield Finding(
                    "selector",
                    Verdict.WARNING,
                    f"matches none of the {len(topology.functions)} PCI functions of this node",
                    "compare it with lspci -nn (vendor, device, class) and the functions' drivers and interfaces",
                    resource=r.name,
                    field=f"options.selectors[{i}]",
                )
