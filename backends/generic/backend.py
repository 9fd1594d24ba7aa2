"""The generic backend on the event loop: scanning, hotplug, health and preparation.

:class:`GenericBackend` serves every resource configured with ``backend: generic``. ``run`` scans
(``discovery``) and publishes a snapshot per resource, then rescans on every udev event (the
SDK's :class:`~cdiplug.sdk.UdevWatch`, where the sysfs root is a real one) and every
``rescan_interval`` seconds as a safety net. Health:

- a device seen once and gone now (unplugged, its node removed) stays listed, Unhealthy with the
  cause ``unplugged`` (DRA: the taint ``cdiplug.dev/unplugged``, ``NoExecute`` with
  ``evict_unplugged``); back again, it is Healthy under the same ID;
- a device whose nodes changed (a new minor after a replug) while a container held it carries the
  informational cause ``nodes-changed`` until it is prepared again: that container's copy of the
  node is stale, and says so in the logs and the DRA taint rather than silently.

``count`` (how many containers may share a device at once): through the device plugin each device
is advertised ``count`` times, as ``<id>-slot<k>``; through DRA it is one shared device with the
consumable capacity ``slots: <count>`` (each claim takes one unless it asks for more).
``prepare`` rescans and answers with the nodes as they are now (a replug's new minor).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence

from attrs import evolve

from cdiplug.sdk import (
    Backend,
    BackendError,
    ClaimConfigurable,
    Configured,
    Device,
    DeviceSharing,
    DeviceSnapshot,
    Finding,
    Health,
    HealthCause,
    InvalidRequest,
    ModelLabels,
    NodeChecker,
    PreparationError,
    Preparer,
    RequestPolicy,
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

from .checks import scan_findings
from .claim_config import KIND, GenericClaimConfig, configure
from .discovery import Found, Scan, scan
from .nodes import DevRoot
from .options import GenericOptions
from .usb import scan as scan_usb

log = logging.getLogger(__name__)

UNPLUGGED = "unplugged"
NODES_CHANGED = "nodes-changed"
SLOTS = "slots"
# The kernel sends a device's remove event before its sysfs folder is gone: look again this much later.
SETTLE = 0.25


def slot_id(device_id: str, index: int) -> str:
    return f"{device_id}-slot{index}"


class ResourceState:
    """What one resource has seen: every device found at least once, and the nodes of those held."""

    def __init__(self, config: ResourceConfig[GenericOptions]) -> None:
        self.config = config
        self.options = config.options
        self.known: dict[str, Found] = {}
        self.present: set[str] = set()
        self.held: dict[str, tuple[tuple[str, int | None, int | None], ...]] = {}
        self.slot_of: dict[str, str] = {}
        self.last: Scan | None = None

    @property
    def dra(self) -> bool:
        return str(self.config.api) == "dra"

    def update(self, result: Scan) -> None:
        self.last = result
        self.present = {f.id for f in result.found}
        self.known.update((f.id, f) for f in result.found)

    def mark_gone(self, ports: set[str], nodes: set[str]) -> bool:
        """Take the devices a removal names (a USB port, a device node) out at once, before a rescan."""
        gone = set()
        for device_id in self.present:
            found = self.known[device_id]
            port = dict(found.attributes).get("port")
            if port in ports or any((n.host_path or n.path) in nodes for n in found.edits.device_nodes):
                gone.add(device_id)
        self.present -= gone
        return bool(gone)

    def devices(self) -> list[Device]:
        out: list[Device] = []
        for device_id, found in sorted(self.known.items()):
            cause: HealthCause | None = None
            health = Health.HEALTHY
            if device_id not in self.present:
                health, cause = Health.UNHEALTHY, HealthCause(UNPLUGGED, evict=self.options.evict_unplugged)
            elif device_id in self.held and self.held[device_id] != found.numbers:
                cause = HealthCause(NODES_CHANGED)
            count = self.options.groups[found.group].count
            base = Device(device_id, health=health, edits=found.edits, attributes=found.attributes, health_cause=cause)
            if count == 1:
                out.append(base)
            elif self.dra:
                policy = RequestPolicy(default="1", min="1", max=str(count), step="1")
                sharing = DeviceSharing(shared=True, capacity_policies={SLOTS: policy})
                out.append(evolve(base, capacity={SLOTS: str(count)}, sharing=sharing))
            else:
                for k in range(count):
                    self.slot_of[slot_id(device_id, k)] = device_id
                    out.append(evolve(base, id=slot_id(device_id, k)))
        return out

    def snapshot(self) -> DeviceSnapshot:
        last = self.last or Scan((), (), ())
        return DeviceSnapshot(self.config.name, devices=self.devices(), skipped=last.skipped, explained=last.explained)


class GenericBackend(Backend, Preparer, Unpreparer, ClaimConfigurable[GenericClaimConfig], ModelLabels, NodeChecker):
    """The ``generic`` backend (see the module docstring)."""

    def __init__(
        self, resources: Sequence[ResourceConfig[GenericOptions]], world: World, *, udev_monitor: UdevMonitor | None = None
    ) -> None:
        self.resources = tuple(resources)
        self.world = world
        self.dev = DevRoot(world.dev_root)
        self.states = {r.name: ResourceState(r) for r in resources}
        self.udev_monitor = udev_monitor
        self._sink: SnapshotSink | None = None
        self._published: dict[str, DeviceSnapshot] = {}
        self._lock = asyncio.Lock()
        self._settle = asyncio.Event()
        self.rescans = 0

    def _scan_sync(self) -> dict[str, Scan]:
        usb = list(scan_usb(self.world.sysfs_root)) if any(g.usb for s in self.states.values() for g in s.options.groups) else []
        return {name: scan(s.options, self.dev, self.world.sysfs_root, usb) for name, s in self.states.items()}

    async def _scan(self) -> dict[str, Scan]:
        try:
            return await asyncio.to_thread(self._scan_sync)
        except OSError as exc:
            raise BackendError(f"cannot scan {self.world.dev_root} and {self.world.sysfs_root}: {exc}") from exc

    async def rescan(self) -> Mapping[str, DeviceSnapshot]:
        async with self._lock:
            results = await self._scan()
            self.rescans += 1
            for name, result in results.items():
                self.states[name].update(result)
            self._publish()
            return self._published

    def _publish(self) -> None:
        for name, state in self.states.items():
            snap = state.snapshot()
            old = self._published.get(name)
            if old is None or old != snap:
                for device in snap.devices:
                    was = old.get(device.id) if old is not None else None
                    if device.cause is not None and (was is None or was.cause != device.cause):
                        log.warning("%s: %s", device.id, device.cause.name, extra={"resource": name})
                self._published[name] = snap
                if self._sink is not None:
                    self._sink.publish(snap)

    # -- run -------------------------------------------------------------------------------------

    async def run(self, sink: SnapshotSink) -> None:
        self._sink = sink
        self._published.clear()
        await self.rescan()
        monitor = self.udev_monitor if self.udev_monitor is not None else open_monitor(self.world.sysfs_root)
        tasks = {"generic:rescan": self._rescan_periodically()}
        if monitor is not None:
            tasks["generic:udev"] = self._watch_udev(monitor)
            tasks["generic:settle"] = self._rescan_settled()
        try:
            await run_tasks("generic backend", tasks)
        finally:
            if monitor is not None and monitor is not self.udev_monitor:
                close_monitor(monitor)

    async def _rescan_periodically(self) -> None:
        interval = min((s.options.rescan_interval for s in self.states.values()), default=30.0)
        while True:
            await asyncio.sleep(interval)
            await self.rescan()

    async def _watch_udev(self, monitor: UdevMonitor) -> None:
        """Rescan on each batch of events. A removal is taken at its word at once: the kernel
        sends it before the device's sysfs folder is gone, so the rescan that confirms it waits a
        moment (``SETTLE``) rather than seeing the device still there."""
        async for events in UdevWatch(monitor).batches():
            removed = [e for e in events if e.action in ("remove", "unbind")]
            if removed:
                ports = {e.sys_name for e in removed if e.subsystem == "usb"}
                nodes = {e.device_node for e in removed if e.device_node}
                if any([state.mark_gone(ports, nodes) for state in self.states.values()]):
                    self._publish()
                self._settle.set()
            else:
                await self.rescan()

    async def _rescan_settled(self) -> None:
        """Once more a moment after a removal: what the first rescan may still have seen is gone by then."""
        while True:
            await self._settle.wait()
            await asyncio.sleep(SETTLE)
            self._settle.clear()
            await self.rescan()

    # -- prepare ---------------------------------------------------------------------------------

    def _state(self, resource: str) -> ResourceState:
        state = self.states.get(resource)
        if state is None:
            raise InvalidRequest(f"resource {resource} is not served by the generic backend")
        return state

    async def prepare(self, resource: str, devices: Sequence[Device]) -> Sequence[Device]:
        """The devices with their nodes as they are now (read again: a replug's new minor)."""
        state = self._state(resource)
        published = await self.rescan()
        snap = published[resource]
        out = []
        for device in devices:
            now = snap.get(device.id)
            if now is None:
                raise PreparationError(device.id, "not found any more")
            if not now.healthy:
                raise PreparationError(
                    device.id, f"unplugged: {', '.join(n.path for n in now.edits.device_nodes) or 'its nodes are'} gone"
                )
            found = state.known[state.slot_of.get(device.id, device.id)]
            state.held[found.id] = found.numbers
            out.append(now)
        self._publish()
        return out

    async def unprepare(self, resource: str, device_ids: Sequence[str]) -> None:
        state = self._state(resource)
        for device_id in device_ids:
            state.held.pop(state.slot_of.get(device_id, device_id), None)
        self._publish()

    # -- per-claim configuration -------------------------------------------------------------------

    def claim_config_type(self, resource: str) -> type[GenericClaimConfig]:
        return GenericClaimConfig

    def claim_config_kind(self, resource: str) -> str:
        return KIND

    def configure(self, resource: str, device: Device, config: GenericClaimConfig) -> Configured:
        self._state(resource)
        return configure(device, config)

    # -- node labels (ModelLabels) ----------------------------------------------------------------

    def model_labels(self, resource: str, snapshot: DeviceSnapshot) -> Mapping[str, str | int]:
        """The USB vendor and product IDs, when every device of the resource has the same (never a
        serial or a port: they name one device, not the model)."""
        values = [dict(d.attributes) for d in snapshot.devices]
        return {
            key: value
            for key in ("vendor", "product")
            if values and isinstance(value := values[0].get(key), str) and all(v.get(key) == value for v in values)
        }

    async def node_checks(self) -> Sequence[Finding]:
        """Each resource's paths and selectors against the node now (:mod:`.checks`)."""
        return list(scan_findings(self.resources, await self._scan()))
