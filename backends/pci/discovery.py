"""Which PCI functions each resource advertises, and why any selected function is not advertised.

Pure functions of one sysfs scan (:class:`~cdiplug_backends.pci.sysfs.PciTopology`), the resources in
config order and what the journal recorded about functions cdiplug bound. No I/O here.

Rules:

- A function goes to the first resource whose selectors pick it. Selectors that look at the
  driver or the network interface match what the function had before cdiplug bound it to
  vfio-pci (recorded in the state folder), so a bound function stays with its resource.
- In VFIO mode the IOMMU group is the unit: a selected function is advertised only when every
  other endpoint function (bridges are left alone) of its group is selected by the same resource
  too, or the resource says ``whole_group`` and no other resource claims them (they are bound
  along). Preparing a device prepares every endpoint function of its group.
- In VFIO mode a function without an IOMMU group is skipped unless ``noiommu`` is set and vfio's
  ``enable_unsafe_noiommu_mode`` is on; bridges and SR-IOV PFs with VFs enabled are skipped;
  functions on the ``denylist`` are skipped unless ``force``.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from fnmatch import fnmatchcase

from attrs import field, frozen

from cdiplug.sdk import (
    PCI_BUS_ID_ATTRIBUTE,
    PCIE_ROOT_ATTRIBUTE,
    AttributeValue,
    ContainerEdits,
    Device,
    DeviceNode,
    DeviceSnapshot,
    Health,
    HealthCause,
    ResourceConfig,
)

from .options import PciOptions, Selector, parse_hex
from .sysfs import PciFunction, PciTopology

VFIO_CONTAINER = "/dev/vfio/vfio"
IOMMUFD = "/dev/iommu"


@frozen
class Recorded:
    """What cdiplug recorded about a function before binding it (see ``journal``)."""

    original_driver: str | None = None
    netdevs: tuple[str, ...] = field(default=(), converter=tuple[str, ...])


@frozen
class Selection:
    """One resource's share of a scan: what it advertises, what it skips, what each group binds."""

    resource: str
    functions: tuple[PciFunction, ...] = ()
    skipped: tuple[tuple[str, str], ...] = ()
    # IOMMU group -> every endpoint function that preparing the group binds (advertised or not).
    group_members: Mapping[str, tuple[str, ...]] = field(factory=dict)


def ids_env(resource: str) -> str:
    """KubeVirt's convention: ``example.com/nic-vfio`` -> ``PCI_RESOURCE_EXAMPLE_COM_NIC_VFIO``."""
    return "PCI_RESOURCE_" + re.sub(r"[^A-Za-z0-9]", "_", resource).upper()


def device_env(address: str) -> str:
    """Per-device env of a function without device nodes: ``PCI_DEVICE_0000_3B_02_0``."""
    return "PCI_DEVICE_" + re.sub(r"[^A-Za-z0-9]", "_", address).upper()


def group_node(group: str, topology: PciTopology) -> str:
    return f"/dev/vfio/noiommu-{group}" if group in topology.noiommu_groups else f"/dev/vfio/{group}"


def _matches(selector: Selector, fn: PciFunction, topology: PciTopology, recorded: Recorded | None) -> bool:
    if selector.vendor is not None and fn.vendor != parse_hex(selector.vendor):
        return False
    if selector.device is not None and fn.device != parse_hex(selector.device):
        return False
    cls = selector.class_value
    if cls is not None and (fn.class_code & cls[1]) != cls[0]:
        return False
    if selector.driver is not None:
        driver = recorded.original_driver if recorded is not None else fn.driver
        if driver is None or not fnmatchcase(driver, selector.driver):
            return False
    if selector.addresses and not any(fnmatchcase(fn.address, g.lower()) for g in selector.addresses):
        return False
    if selector.pf is not None:
        pf = topology.functions.get(fn.physfn) if fn.physfn else None
        if pf is None or not any(fnmatchcase(n, selector.pf) for n in pf.netdevs):
            return False
    if selector.netdev is not None:
        names = set(fn.netdevs) | set(recorded.netdevs if recorded is not None else ())
        if not any(fnmatchcase(n, selector.netdev) for n in names):
            return False
    return True


def selects(options: PciOptions, fn: PciFunction, topology: PciTopology, recorded: Recorded | None = None) -> bool:
    return any(_matches(s, fn, topology, recorded) for s in options.selectors)


def denied_by(options: PciOptions, address: str) -> str | None:
    """The denylist entry naming ``address``, if any."""
    return next((g for g in options.denylist if fnmatchcase(address, g.lower())), None)


def _own_problem(options: PciOptions, fn: PciFunction, noiommu_enabled: bool) -> str | None:
    """Why ``fn`` cannot be advertised by itself (group aside), or None."""
    if fn.problem is not None:
        return fn.problem
    if not options.force:
        entry = denied_by(options, fn.address)
        if entry is not None:
            return f"on the denylist ({entry})"
    if not options.vfio:
        return None
    if fn.is_bridge:
        return f"a bridge (class 0x{fn.class_code:06x}): VFIO leaves bridges with the host"
    if fn.virtfns:
        return f"an SR-IOV physical function with {len(fn.virtfns)} VFs enabled: select its VFs instead"
    if fn.iommu_group is None:
        if options.noiommu and noiommu_enabled:
            return None
        if options.noiommu:
            return "no IOMMU group and vfio's enable_unsafe_noiommu_mode is off"
        return "no IOMMU group (turn the IOMMU on: intel_iommu=on or amd_iommu=on; or use noiommu: true)"
    return None


def select_all(
    topology: PciTopology,
    resources: Sequence[ResourceConfig[PciOptions]],
    recorded: Mapping[str, Recorded] | None = None,
    noiommu_enabled: bool = False,
) -> dict[str, Selection]:
    """Every resource's :class:`Selection` from one scan, resources in config order."""
    recorded = recorded or {}
    owner: dict[str, str] = {}
    picked: dict[str, list[PciFunction]] = {r.name: [] for r in resources}
    for fn in topology.functions.values():
        for r in resources:
            if selects(r.options, fn, topology, recorded.get(fn.address)):
                owner[fn.address] = r.name
                picked[r.name].append(fn)
                break

    result: dict[str, Selection] = {}
    for r in resources:
        options: PciOptions = r.options
        ok: list[PciFunction] = []
        skipped: dict[str, str] = {}
        for fn in picked[r.name]:
            problem = _own_problem(options, fn, noiommu_enabled)
            if problem is None:
                ok.append(fn)
            else:
                skipped[fn.address] = problem
        members: dict[str, tuple[str, ...]] = {}
        if options.vfio:
            ok, members = _group_rule(r.name, options, ok, skipped, topology, owner)
        result[r.name] = Selection(
            resource=r.name,
            functions=tuple(ok),
            skipped=tuple(sorted(skipped.items())),
            group_members=members,
        )
    return result


def _group_rule(
    resource: str,
    options: PciOptions,
    ok: list[PciFunction],
    skipped: dict[str, str],
    topology: PciTopology,
    owner: Mapping[str, str],
) -> tuple[list[PciFunction], dict[str, tuple[str, ...]]]:
    """Keep the functions whose whole group can go to ``resource``; say why the others cannot."""
    ok_addresses = {fn.address for fn in ok}
    by_group: dict[str, list[PciFunction]] = {}
    for fn in ok:
        by_group.setdefault(fn.iommu_group or f"noiommu:{fn.address}", []).append(fn)
    kept: list[PciFunction] = []
    members: dict[str, tuple[str, ...]] = {}
    for group, fns in by_group.items():
        if group.startswith("noiommu:"):
            kept.extend(fns)
            members[group] = (fns[0].address,)
            continue
        endpoints = [a for a in topology.group_members(group) if not topology.functions[a].is_bridge]
        problem = None
        for address in endpoints:
            if address in ok_addresses:
                continue
            other = owner.get(address)
            if other == resource:
                problem = f"IOMMU group {group} also holds {address}, which is skipped: {skipped.get(address, 'not usable')}"
            elif other is not None:
                problem = f"IOMMU group {group} also holds {address}, which resource {other} selects"
            elif not options.whole_group:
                problem = (
                    f"IOMMU group {group} also holds {address}, not selected by this resource (whole_group: true takes it along)"
                )
            elif not options.force and denied_by(options, address):
                problem = f"IOMMU group {group} also holds {address}, which is on the denylist"
            if problem:
                break
        if problem:
            for fn in fns:
                skipped[fn.address] = problem
            continue
        kept.extend(fns)
        members[group] = tuple(endpoints)
    kept.sort(key=lambda fn: fn.address)
    return kept, members


LINK_DOWN = HealthCause("link-down")
"""Why a function is Unhealthy under ``link_health``: its network interface is down (DRA taint ``cdiplug.dev/link-down``)."""


def to_snapshot(
    selection: Selection,
    options: PciOptions,
    topology: PciTopology,
    recorded: Mapping[str, Recorded] | None = None,
    unhealthy: Collection[str] = (),
    iommufd: bool = False,
) -> DeviceSnapshot:
    """The resource's :class:`DeviceSnapshot` (see ``backends/pci/__init__.py`` for the edits)."""
    recorded = recorded or {}
    devices = []
    for fn in selection.functions:
        nodes: list[DeviceNode] = []
        group = fn.iommu_group
        if options.vfio and group is not None:
            nodes.append(DeviceNode(path=group_node(group, topology)))
            if iommufd and fn.vfio_dev:
                nodes.append(DeviceNode(path=f"/dev/vfio/devices/{fn.vfio_dev}"))
        edits = ContainerEdits(device_nodes=nodes) if nodes else ContainerEdits(env={device_env(fn.address): fn.address})
        attributes: dict[str, AttributeValue] = {
            "vendor": f"0x{fn.vendor:04x}",
            "device": f"0x{fn.device:04x}",
            "class": f"0x{fn.class_code:06x}",
            "driver": fn.driver or "",
            "address": fn.address,
        }
        # Typed, for DRA claims to select on (CEL): the NUMA node and the PCIe root complex.
        if fn.numa_node is not None:
            attributes["numa_node"] = fn.numa_node
        if fn.pcie_root is not None:
            attributes[PCIE_ROOT_ATTRIBUTE] = fn.pcie_root
        attributes[PCI_BUS_ID_ATTRIBUTE] = fn.address
        if fn.subsystem_vendor is not None:
            attributes["subsystem"] = f"0x{fn.subsystem_vendor:04x}:0x{(fn.subsystem_device or 0):04x}"
        if group is not None:
            attributes["iommu_group"] = group
        if fn.physfn:
            attributes["physfn"] = fn.physfn
        if fn.netdevs:
            attributes["netdevs"] = ",".join(fn.netdevs)
        rec = recorded.get(fn.address)
        if rec is not None:
            attributes["original_driver"] = rec.original_driver or ""
        prepare_group = None
        if options.vfio:
            prepare_group = group if group is not None else f"noiommu:{fn.address}"
        devices.append(
            Device(
                id=fn.address,
                health=Health.UNHEALTHY if fn.address in unhealthy else Health.HEALTHY,
                health_cause=LINK_DOWN if fn.address in unhealthy else None,
                numa_nodes=(fn.numa_node,) if fn.numa_node is not None else (),
                edits=edits,
                prepare_group=prepare_group,
                attributes=attributes,
            )
        )
    common = ContainerEdits()
    if options.vfio:
        nodes = [DeviceNode(path=VFIO_CONTAINER)]
        if iommufd:
            nodes.append(DeviceNode(path=IOMMUFD))
        common = ContainerEdits(device_nodes=nodes)
    return DeviceSnapshot(
        resource=selection.resource,
        devices=devices,
        common_edits=common,
        ids_env=ids_env(selection.resource),
        skipped=selection.skipped,
    )
