"""The PCI backend on the event loop: scanning, watching, preparing (binding) and releasing.

:class:`PciBackend` serves every resource configured with ``backend: pci``. ``run``:

1. finishes or rolls back what a crash left half done (``vfio.VfioBinder.recover``; a bind is
   finished only when the functions still on a host driver pass the bind's safety checks, see
   :meth:`PciBackend.check_in_use`),
2. scans sysfs and publishes a snapshot per resource (``discovery``),
3. rescans on every udev event of a PCI device (add, remove, bind, unbind; the SDK's ``UdevWatch``) and
   every ``rescan_interval`` seconds as a fallback (fake trees have no udev); a removed function
   leaves its snapshot at once,
4. follows link state through netlink for resources with ``link_health`` (a network function
   whose interface is down is Unhealthy),
5. names, for resources with ``release: restore``, the functions it bound that may go back to
   their original driver (``release``; the :class:`~cdiplug.sdk.ReleasePoller` ability: the
   front ends decide when a device is free, ``unprepare`` restores it, the ``Unpreparer`` ability).

``prepare`` (the :class:`~cdiplug.sdk.Preparer` ability) binds a device's whole IOMMU group
to vfio-pci after the safety checks (``safety``), then rescans so the new driver shows, and
returns the devices as found then. The host calls it one group at a time across all resources
(its per-group locks); an ``flock`` per group in the state folder keeps ``cdiplug vfio`` at a
shell out of the way. Blocking work runs in threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

from attrs import frozen
from pyroute2.netlink.exceptions import NetlinkError

from cdiplug.sdk import (
    Backend,
    BackendError,
    CdiplugError,
    ClaimConfigurable,
    Configured,
    Device,
    DeviceSnapshot,
    Finding,
    InvalidRequest,
    ModelLabels,
    NodeChecker,
    NoSuchDevice,
    PreparationError,
    Preparer,
    ReleasePoller,
    ResourceConfig,
    SnapshotSink,
    UdevMonitor,
    UdevWatch,
    Unpreparer,
    World,
    close_monitor,
    open_monitor,
    run_tasks,
)

from . import checks
from .claim_config import KIND, PciClaimConfig
from .claim_config import admin_access as admin_claim
from .claim_config import configure as configure_claim
from .discovery import (
    Recorded,
    Selection,
    denied_by,
    group_node,
    select_all,
    to_snapshot,
)
from .journal import BoundRecord, Journal, JournalError
from .links import LinkStates
from .options import PciOptions, Release
from .release import releasable
from .safety import FunctionInUse, SafetyChecker
from .sysfs import PciFunction, PciSysfs, PciTopology, check_address
from .vfio import VFIO_DRIVER, BindResult, RestoreResult, SysfsWriter, VfioBinder

log = logging.getLogger(__name__)

LINK_RETRY = 5.0


@frozen
class ScanState:
    """One scan and what every resource made of it."""

    topology: PciTopology
    selections: Mapping[str, Selection]
    snapshots: Mapping[str, DeviceSnapshot]
    recorded: Mapping[str, BoundRecord]


class PciBackend(Backend, Preparer, Unpreparer, ReleasePoller, ClaimConfigurable[PciClaimConfig], ModelLabels, NodeChecker):
    """The ``pci`` backend (see the module docstring)."""

    def __init__(
        self,
        resources: Sequence[ResourceConfig[PciOptions]],
        world: World,
        *,
        writer: SysfsWriter | None = None,
        netns: str | None = None,
        udev_monitor: UdevMonitor | None = None,
        verify_timeout: float | None = None,
    ) -> None:
        self.resources = tuple(resources)
        self.world = world
        self.options: dict[str, PciOptions] = {r.name: r.options for r in self.resources}
        self.sysfs = PciSysfs(world.sysfs_root)
        self.journal = Journal(world.own_state_dir)
        self.binder = VfioBinder(self.sysfs, self.journal, world.dev_root, writer, check_in_use=self.check_in_use)
        if verify_timeout is not None:
            self.binder.verify_timeout = verify_timeout
        self.safety = {name: SafetyChecker(self.sysfs, o.mountinfo, o.proc_root, netns) for name, o in self.options.items()}
        self.default_safety = SafetyChecker(self.sysfs, netns=netns)
        self.links = LinkStates(netns) if any(o.link_health for o in self.options.values()) else None
        self.udev_monitor = udev_monitor
        self.state: ScanState | None = None
        self._sink: SnapshotSink | None = None
        self._published: dict[str, DeviceSnapshot] = {}
        self._scan_lock = asyncio.Lock()
        self._wake = asyncio.Event()

    # -- scanning ------------------------------------------------------------------------------

    def _scan_sync(self) -> tuple[PciTopology, Mapping[str, BoundRecord], bool, bool]:
        topology = self.sysfs.scan()
        try:
            recorded = self.journal.all_bound()
        except JournalError as exc:
            # Without the records, selectors on driver or netdev miss functions cdiplug bound;
            # everything else is still right, so say so and go on.
            log.warning("cannot read what cdiplug bound (%s): bound functions may be missed", exc)
            recorded = {}
        iommufd = self.world.host_path("/dev/iommu").exists()
        return topology, recorded, self.sysfs.noiommu_enabled(), iommufd

    def _unhealthy(self, topology: PciTopology) -> set[str]:
        """Functions with a network interface that netlink reports down (``link_health``)."""
        if self.links is None:
            return set()
        return {fn.address for fn in topology.functions.values() if fn.netdevs and self.links.down(fn.netdevs)}

    async def rescan(self) -> ScanState:
        """Scan sysfs, publish what changed, and return the new state."""
        async with self._scan_lock:
            try:
                topology, records, noiommu, iommufd = await asyncio.to_thread(self._scan_sync)
            except (OSError, CdiplugError) as exc:
                raise BackendError(f"cannot scan PCI functions under {self.world.sysfs_root}: {exc}") from exc
            recorded = {a: Recorded(r.original_driver, r.netdevs) for a, r in records.items()}
            selections = select_all(topology, self.resources, recorded, noiommu)
            unhealthy = self._unhealthy(topology)
            snapshots = {
                r.name: to_snapshot(
                    selections[r.name],
                    r.options,
                    topology,
                    recorded,
                    unhealthy if r.options.link_health else (),
                    iommufd,
                )
                for r in self.resources
            }
            self.state = ScanState(topology, selections, snapshots, records)
            self._publish(snapshots)
            return self.state

    def _publish(self, snapshots: Mapping[str, DeviceSnapshot]) -> None:
        for name, snap in snapshots.items():
            if self._published.get(name) != snap or name not in self._published:
                for address, reason in snap.skipped:
                    if address not in dict(self._published[name].skipped if name in self._published else ()):
                        log.info("not advertising %s: %s", address, reason, extra={"resource": name})
                self._published[name] = snap
                if self._sink is not None:
                    self._sink.publish(snap)

    def _drop(self, addresses: set[str]) -> None:
        """Take removed functions out of every snapshot at once, before the rescan confirms it."""
        dropped = {
            name: snap.with_devices(d for d in snap.devices if d.id not in addresses)
            for name, snap in self._published.items()
            if any(d.id in addresses for d in snap.devices)
        }
        self._publish(dropped)

    # -- run -------------------------------------------------------------------------------------

    async def run(self, sink: SnapshotSink) -> None:
        self._sink = sink
        try:
            for line in await asyncio.to_thread(self.binder.recover):
                log.warning("journal recovery: %s", line)
        except CdiplugError as exc:
            # A group we cannot put right must not keep every other device from being served.
            log.error("journal recovery failed: %s (it is tried again before that group is used)", exc)
        self._published.clear()
        await self.rescan()
        monitor = self._open_monitor()
        tasks = {"pci:rescan": self._rescan_periodically()}
        if monitor is not None:
            tasks["pci:udev"] = self._watch_udev(monitor)
        if self.links is not None:
            tasks["pci:links"] = self._watch_links(self.links)
        try:
            await run_tasks("PCI backend", tasks)
        finally:
            if monitor is not None and monitor is not self.udev_monitor:
                close_monitor(monitor)

    async def _rescan_periodically(self) -> None:
        """Rescan when woken (link state changed) or, as the fallback, every ``rescan_interval``."""
        interval = min((o.rescan_interval for o in self.options.values()), default=30.0)
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), interval)
            self._wake.clear()
            await self.rescan()

    async def _watch_links(self, links: LinkStates) -> None:
        """Follow link state; netlink trouble only costs link health, so retry rather than stop."""
        while True:
            try:
                await links.run(self._wake.set)
            except (OSError, NetlinkError) as exc:
                log.error("link state through netlink failed (%s); trying again in %g s", exc, LINK_RETRY)
            links.up.clear()  # unknown, not down: nothing turns Unhealthy for want of netlink
            self._wake.set()
            await asyncio.sleep(LINK_RETRY)

    def _open_monitor(self) -> UdevMonitor | None:
        return self.udev_monitor if self.udev_monitor is not None else open_monitor(self.world.sysfs_root, ("pci",))

    async def _watch_udev(self, monitor: UdevMonitor) -> None:
        async for events in UdevWatch(monitor, ("pci",)).batches():
            removed = {e.sys_name for e in events if e.action == "remove"}
            if removed:
                self._drop(removed)
            await self.rescan()

    # -- prepare -----------------------------------------------------------------------------------

    async def prepare(self, resource: str, devices: Sequence[Device]) -> Sequence[Device]:
        """Bind the groups of ``devices`` to vfio-pci; the devices as sysfs shows them afterwards.

        The host calls it one preparation group at a time, under that group's lock.
        """
        options = self.options.get(resource)
        if options is None:
            raise PreparationError(devices[0].id if devices else "?", f"resource {resource} is not served by the PCI backend")
        if not options.vfio or not devices:
            return devices
        groups: dict[str, list[Device]] = {}
        for d in devices:
            groups.setdefault(d.prepare_group or f"noiommu:{d.id}", []).append(d)
        try:
            for group in sorted(groups):
                await self._prepare_group(resource, options, groups[group])
        finally:
            await self._rescan_quietly()
        # A freshly bound function gains its iommufd cdev: answer with what the rescan found.
        published = self._published.get(resource)
        return [(published.get(d.id) if published is not None else None) or d for d in devices]

    async def _prepare_group(self, resource: str, options: PciOptions, devices: Sequence[Device]) -> None:
        state = await self.rescan()
        selection = state.selections[resource]
        advertised = {fn.address: fn for fn in selection.functions}
        skipped = dict(selection.skipped)
        for d in devices:
            if d.id not in advertised:
                why = skipped.get(d.id) or ("gone from sysfs" if d.id not in state.topology.functions else "no longer selected")
                raise PreparationError(d.id, f"not advertised any more: {why}")
        first = advertised[devices[0].id]
        group = first.iommu_group or f"noiommu:{first.address}"
        members = selection.group_members.get(group, (first.address,))
        functions = [state.topology.functions[a] for a in members if a in state.topology.functions]
        need = [fn for fn in functions if fn.driver != VFIO_DRIVER]
        if need and not options.force:
            denied = {fn.address: e for fn in need if (e := denied_by(options, fn.address)) is not None}
            await self.safety[resource].check_bind(need, denied)
        await self._bind(group, members, resource, first.address)

    def check_in_use(self, resource: str | None, functions: Sequence[PciFunction]) -> None:
        """The bind's safety checks for journal recovery (blocking: the binder calls it in its
        thread, under the group's lock). ``resource`` is what the journal entry names: its
        ``force``, denylist and checker apply; None or a resource no longer configured gets the
        strictest, the default checker without force. Raises :class:`FunctionInUse`."""
        if resource is None or (options := self.options.get(resource)) is None:
            asyncio.run(self.default_safety.check_bind(functions))
        elif not options.force:
            denied = {fn.address: e for fn in functions if (e := denied_by(options, fn.address)) is not None}
            # netlink is asynchronous; this thread has no loop of its own, so run one for the check.
            asyncio.run(self.safety[resource].check_bind(functions, denied))

    async def _bind(self, group: str, members: Sequence[str], resource: str | None, address: str) -> BindResult:
        """``bind_group`` in a thread; a state-folder failure is a failed preparation of ``address``."""
        try:
            return await asyncio.to_thread(self.binder.bind_group, group, members, resource)
        except PreparationError:
            raise
        except CdiplugError as exc:
            raise PreparationError(address, str(exc)) from exc

    # -- per-claim configuration (ClaimConfigurable; claim_config) --------------------------------

    def claim_config_type(self, resource: str) -> type[PciClaimConfig]:
        return PciClaimConfig

    def claim_config_kind(self, resource: str) -> str:
        return KIND

    def configure(self, resource: str, device: Device, config: PciClaimConfig) -> Configured:
        options = self.options.get(resource)
        if options is None:
            raise InvalidRequest(f"resource {resource} is not served by the PCI backend")
        return configure_claim(resource, options, device, config)

    def admin_access(self, resource: str, device: Device) -> Configured:
        options = self.options.get(resource)
        if options is None:
            raise InvalidRequest(f"resource {resource} is not served by the PCI backend")
        return admin_claim(options, device)

    # -- node labels (ModelLabels) ------------------------------------------------------------------

    def model_labels(self, resource: str, snapshot: DeviceSnapshot) -> Mapping[str, str | int]:
        """The PCI vendor and device IDs (``0x10de``), when every function of the resource has the same."""
        values = [dict(d.attributes) for d in snapshot.devices]
        return {
            key: value
            for key in ("vendor", "device")
            if values and isinstance(value := values[0].get(key), str) and all(v.get(key) == value for v in values)
        }

    # -- release (Unpreparer) -----------------------------------------------------------------------

    def release_interval(self, resource: str) -> float | None:
        options = self.options.get(resource)
        return options.release_interval if options is not None and options.release is Release.RESTORE else None

    async def releasable(self, resource: str) -> Sequence[str]:
        """Functions cdiplug bound for ``resource`` (this run or an earlier one), past their grace
        time: a fresh bind looks unheld until the kubelet has recorded our Allocate answer."""
        options = self.options.get(resource)
        if options is None or options.release is not Release.RESTORE:
            return []
        records = await asyncio.to_thread(self.journal.all_bound)
        return releasable(records, resource, options.release_grace, self.binder.clock())

    async def unprepare(self, resource: str, device_ids: Sequence[str]) -> None:
        """``release: restore``: give the functions back to their original driver (``keep``: nothing)."""
        options = self.options.get(resource)
        if options is None or options.release is not Release.RESTORE:
            return
        await self.restore(device_ids)

    # -- restore -----------------------------------------------------------------------------------

    async def restore(self, addresses: Sequence[str], force: bool = False) -> list[RestoreResult]:
        """Give functions back to their original drivers, by IOMMU group (refusing groups in use)."""
        state = self.state or await self.rescan()
        by_group: dict[str, list[str]] = {}
        for address in addresses:
            fn = state.topology.functions.get(address)
            if fn is None:
                raise PreparationError(address, "not found in sysfs")
            by_group.setdefault(fn.iommu_group or f"noiommu:{address}", []).append(address)
        results = []
        try:
            for group, members in sorted(by_group.items()):
                if not force and not group.startswith("noiommu:"):
                    await self._refuse_open_group(group, members[0], state.topology)
                results.append(await asyncio.to_thread(self.binder.restore_group, group, members))
        finally:
            await self._rescan_quietly()
        return results

    async def _refuse_open_group(self, group: str, address: str, topology: PciTopology) -> None:
        """FunctionInUse when a process holds the group's node, or (iommufd) the cdev of any
        function of the group: a VMM using iommufd never opens the group node."""
        # /proc/<pid>/fd links name the nodes as processes see them: /dev/vfio/...
        nodes = [group_node(group, topology)]
        for member in topology.group_members(group):
            fn = topology.functions[member]
            if fn.vfio_dev is not None:
                nodes.append(f"/dev/vfio/devices/{fn.vfio_dev}")
        held = await asyncio.to_thread(self._any_safety().holders, [Path(n) for n in nodes])
        if held:
            raise FunctionInUse(address, "; ".join(f"{node} is open by {', '.join(pids)}" for node, pids in sorted(held.items())))

    async def _rescan_quietly(self) -> None:
        """Rescan after a change; a failing scan must not hide the outcome of that change."""
        try:
            await self.rescan()
        except BackendError as exc:
            log.error("rescan after a bind or restore failed: %s", exc)

    def _any_safety(self) -> SafetyChecker:
        return next(iter(self.safety.values()), self.default_safety)

    async def clean_up(self) -> Sequence[str]:
        """Uninstall (``cdiplug cleanup``): finish or roll back what the journal left half done,
        then give every function this instance bound to vfio-pci back to its original driver,
        whoever holds it (the daemon has stopped; its pods are going)."""
        lines = [f"journal: {line}" for line in await asyncio.to_thread(self.binder.recover)]
        bound = sorted(await asyncio.to_thread(self.journal.all_bound))
        if bound:
            for result in await self.restore(bound, force=True):
                lines += [f"{address}: returned to {driver or 'no driver'}" for address, driver in result.restored]
        return lines

    # -- for people at a node (``cdiplug vfio``, ``cdiplug doctor``) ---------------------------------

    async def node_checks(self) -> Sequence[Finding]:
        """The IOMMU, vfio-pci and the resources' options against a scan (:mod:`.checks`)."""
        findings = await asyncio.to_thread(lambda: list(checks.node_findings(self.sysfs, self.world, self.resources)))
        state = await self.rescan()
        recorded = {a: Recorded(r.original_driver, r.netdevs) for a, r in state.recorded.items()}
        findings.extend(checks.option_findings(self.resources, state.topology, recorded))
        return findings

    def _group_of(self, state: ScanState, address: str) -> tuple[str, tuple[str, ...]]:
        """The group key of ``address`` and the endpoint functions preparing it binds."""
        fn = state.topology.functions.get(address)
        if fn is None:
            raise NoSuchDevice(address, f"no PCI function has this address under {self.world.sysfs_root}/bus/pci/devices")
        if fn.iommu_group is None:
            if not self.sysfs.noiommu_enabled():
                raise PreparationError(address, "it has no IOMMU group (turn the IOMMU on, or vfio's enable_unsafe_noiommu_mode)")
            return f"noiommu:{address}", (address,)
        members = tuple(a for a in state.topology.group_members(fn.iommu_group) if not state.topology.functions[a].is_bridge)
        return fn.iommu_group, members

    async def bind_address(self, address: str, force: bool = False) -> BindResult:
        """Bind the function's whole IOMMU group to vfio-pci (``cdiplug vfio bind``)."""
        check_address(address)
        state = await self.rescan()
        group, members = self._group_of(state, address)
        need = [state.topology.functions[a] for a in members if state.topology.functions[a].driver != VFIO_DRIVER]
        if need and not force:
            await self.default_safety.check_bind(need)
        result = await self._bind(group, members, None, address)
        await self.rescan()
        return result

    async def unbind_address(self, address: str, force: bool = False) -> list[RestoreResult]:
        """Return the function, and the other functions of its group cdiplug bound, to their
        original drivers (``cdiplug vfio unbind``)."""
        check_address(address)
        state = await self.rescan()
        group, members = self._group_of(state, address)
        ours = [a for a in members if a == address or a in state.recorded]
        return await self.restore(ours, force=force)

    async def status(self, address: str) -> FunctionStatus:
        check_address(address)
        state = await self.rescan()
        fn = state.topology.functions.get(address)
        if fn is None:
            raise NoSuchDevice(address, f"no PCI function has this address under {self.world.sysfs_root}/bus/pci/devices")
        members = state.topology.group_members(fn.iommu_group)
        node = group_node(fn.iommu_group, state.topology) if fn.iommu_group is not None else None
        pending = await asyncio.to_thread(self.journal.pending, fn.iommu_group) if fn.iommu_group else []
        return FunctionStatus(
            function=fn,
            driver_override=await asyncio.to_thread(self.sysfs.read_driver_override, address),
            group_members=tuple((a, state.topology.functions[a].driver) for a in members),
            record=state.recorded.get(address),
            node=node,
            node_present=node is not None and self.world.host_path(node).exists(),
            pending=tuple(f"{e.op.value} interrupted at {e.step.value} of {e.function}" for e in pending),
        )


@frozen
class FunctionStatus:
    """What ``cdiplug vfio status`` shows about one function."""

    function: PciFunction
    driver_override: str | None
    group_members: tuple[tuple[str, str | None], ...]
    record: BoundRecord | None
    node: str | None
    node_present: bool
    pending: tuple[str, ...] = ()


__all__ = ["FunctionStatus", "PciBackend", "ScanState"]
