"""One resource served over the device-plugin API: its allocator and server, and its snapshots.

A :class:`ServedResource` takes snapshots from the host with :meth:`~ServedResource.offer`: the
allocator hears at once, and the updater (:meth:`~ServedResource.run_updates`, one task per
resource) coalesces a burst into the newest, skips an unchanged one, publishes the advertised
list to ListAndWatch and then has the resource's :class:`~cdiplug.host.SpecKeeper` put the CDI
spec on disk (a failure is logged; Allocate asks again and fails clearly). The kubelet hears
first, whatever changed: an Allocate that names CDI devices waits for the keeper anyway (it asks
"is the spec holding these devices on disk" before it answers), so nothing can use a device whose
spec is not written, and at start-up the kubelet learns the devices without waiting for every
resource's spec to be built. The first spec even waits until the kubelet has been asked: the
resource's first Register call answered or failed (at most :data:`FIRST_SPEC_WAIT`; at once for a
first snapshot without devices, which need not bring a Register: ``register_when_empty: false``).
A spec is rendered in a worker thread, which holds the interpreter in slices of milliseconds that
the Register calls of every resource would otherwise queue behind.

The boundary: this module moves snapshots along one resource's pipeline; when tasks run, register
and stop is the front end's business (:mod:`cdiplug.deviceplugin.frontend`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable

from cdiplug.deviceplugin.allocator import Allocator
from cdiplug.deviceplugin.server import ResourceServer
from cdiplug.errors import CdiError
from cdiplug.host import SpecKeeper
from cdiplug.models.devices import Device, DeviceSnapshot
from cdiplug.models.resource import ResourceConfig
from cdiplug.telemetry.recorder import Recorder

log = logging.getLogger(__name__)

FIRST_SPEC_WAIT = 1.0  # seconds the first spec waits for the first Register call (one that hangs)


class ServedResource:
    """One resource's allocator, server and snapshot updates; registrations counted for metrics."""

    def __init__(
        self, config: ResourceConfig[object], allocator: Allocator, server: ResourceServer, spec: SpecKeeper, recorder: Recorder
    ) -> None:
        self.config = config
        self.allocator = allocator
        self.server = server
        self.spec = spec
        self.recorder = recorder
        self.pending: DeviceSnapshot | None = None
        self.applied: DeviceSnapshot | None = None
        self.wake = asyncio.Event()
        self.reported = asyncio.Event()  # the backend sent its first snapshot
        self.found = asyncio.Event()  # some snapshot had a device (register_when_empty: false waits for it)
        self.asked = asyncio.Event()  # the first Register call ended (the front end's)
        self.registrations = 0
        self.log = logging.LoggerAdapter(log, {"resource": config.name})

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def updater_task(self) -> str:
        return f"update:{self.name}"

    @property
    def register_task(self) -> str:
        return f"register:{self.name}"

    # -- snapshots --

    def offer(self, snapshot: DeviceSnapshot) -> None:
        # The allocator hears at once, so an Allocate that made the backend report (binding a
        # function, say) answers from the news; the updater then writes the spec and publishes.
        self.allocator.update(snapshot)
        self.pending = snapshot
        self.reported.set()
        if snapshot.devices:
            self.found.set()
        self.wake.set()

    async def run_updates(self) -> None:
        """The updater: apply the newest offered snapshot whenever one comes; runs until cancelled."""
        while True:
            await self.wake.wait()
            self.wake.clear()
            snapshot, self.pending = self.pending, None
            if snapshot is None or snapshot == self.applied:
                continue
            await self._apply(snapshot)

    async def _apply(self, snapshot: DeviceSnapshot) -> None:
        previous, self.applied = self.applied, snapshot
        self.allocator.update(snapshot)
        if previous is not None:
            self._log_health_changes(previous, snapshot)
        self._publish()
        if previous is None and snapshot.devices:
            # Only with devices: without, no Register may come (register_when_empty: false).
            # asyncio.timeout, not wait_for: a cancel that meets the event being set (the register
            # task's, cancelled with this one, sets it) must not be lost, or a stop would hang.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(FIRST_SPEC_WAIT):
                    await self.asked.wait()
        await self._write_spec(snapshot)  # health or topology only: the keeper finds the file current

    async def _write_spec(self, snapshot: DeviceSnapshot) -> None:
        try:
            if await self.spec.ensure(snapshot):
                self.log.info("wrote CDI spec %s", self.spec.path)
        except CdiError as exc:
            # Not fatal: Allocate writes it again and fails with this error if it still cannot.
            self.log.error("cannot write the CDI spec: %s", exc)

    def _log_health_changes(self, old: DeviceSnapshot, new: DeviceSnapshot) -> None:
        """One INFO line per device whose health changed, so an operator sees why allocatable moved."""
        pairs: Iterable[tuple[Device | None, Device]]
        if len(old.devices) == len(new.devices):
            pairs = zip(old.devices, new.devices)  # the same IDs, mostly: no lookups
        else:
            pairs = ((old.get(d.id), d) for d in new.devices)
        for before, device in pairs:
            if before is device:
                continue  # the same object: nothing changed (a change is a new one)
            if before is None or before.id != device.id:
                before = old.get(device.id)
            if before is not None and before.health is not device.health:
                log.info(
                    "device %s of %s: %s -> %s",
                    device.id,
                    self.name,
                    before.health.value,
                    device.health.value,
                    extra={"resource": self.name, "device": device.id},
                )

    def _publish(self) -> None:
        advertised = self.allocator.advertised
        self.server.publish(advertised)
        healthy = advertised.healthy_count()
        self.recorder.devices(self.name, healthy, len(advertised.devices) - healthy, advertised.unhealthy_causes())
        self.log.debug("%d devices advertised, %d healthy", len(advertised.devices), healthy)

    # -- reload --

    def replace_allocator(self, config: ResourceConfig[object], allocator: Allocator, spec: SpecKeeper) -> None:
        """Serve a new config through ``allocator``; the server, its streams and the kubelet's
        registration stay (the plugin's options never change)."""
        self.config = config
        self.allocator = allocator
        self.spec = spec
        if self.applied is not None:
            # Until the new backend reports, answer from what the old one said; then re-apply it
            # under the new config (replicas, CDI kind), published only if the list changed.
            allocator.update(self.applied)
            if self.pending is None:
                self.pending = self.applied
            self.applied = None
            self.wake.set()
        self.server.allocator = allocator
