"""A resource moving between the device plugin and DRA on a live node: never two pods on one device.

When a reload changes a resource's ``api`` from ``device-plugin`` to ``dra`` the node (in this
order) stops the device plugin's resource (its socket goes, so the kubelet's allocatable drops to
0 and the scheduler sends no new classic pods for it), asks the kubelet's PodResources API which
of its devices running device-plugin pods still hold, and only then starts the DRA driver: those
devices are offered to it Unhealthy with the cause ``device-plugin-pod``, so the ResourceSlice
carries them tainted ``cdiplug.dev/device-plugin-pod=true:NoSchedule`` and no DRA claim gets
them. Every ``interval`` seconds it asks again; a device no pod holds any more loses its taint,
and once none is held the handover is done.

The way back (``dra`` -> ``device-plugin``) is the same with the roles swapped: the DRA driver
stops first (its slices withdrawn), and the devices running pods use through claims of its driver
(PodResources' dynamic resources, ``<node>/<device>`` in the driver's pool) are advertised to the
kubelet Unhealthy (cause ``dra-claim``), which allocates no Unhealthy device, until those pods
are gone.

A kubelet that does not answer means "don't know": every device of the resource stays held until
it does. A daemon that starts with a resource on one API checks once whether the other API's
pods still hold its devices (a DaemonSet rolled with a new configuration, or a restart during a
handover) and holds them the same way; before its backend has reported, which devices claims name
is not known, so every device is held until it has. Each step is logged and, through ``report``, a
Node Event.

The boundary: which devices are held and when they are free; the taint is the DRA front end's,
the holding the host's (:meth:`~cdiplug.host.BackendHost.hold`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from cdiplug.deviceplugin.release import Lister, list_allocated
from cdiplug.errors import KubeletError
from cdiplug.host import BackendHost
from cdiplug.models.devices import HealthCause
from cdiplug.models.names import dns_label_for
from cdiplug.toolkit.supervisor import Supervisor

if TYPE_CHECKING:
    from cdiplug.deviceplugin.pod_resources import AllocatedDevices

log = logging.getLogger(__name__)

HELD = HealthCause("device-plugin-pod")  # the taint cdiplug.dev/device-plugin-pod=true:NoSchedule
CLAIMED = HealthCause("dra-claim")  # held for DRA claims, advertised Unhealthy to the device plugin
TASK = "handover"
Report = Callable[[str, str], None]  # (reason, message): a Node Event
Done = Callable[[str], Awaitable[None]]


def _nothing(reason: str, message: str) -> None:
    pass


class Handover:
    """Holds, for the DRA front end, the devices device-plugin pods still use; see the module docstring."""

    def __init__(
        self,
        host: BackendHost,
        socket: Path,
        supervisor: Supervisor,
        node: str,
        *,
        interval: float = 5.0,
        lister: Lister = list_allocated,
        report: Report = _nothing,
        done: Done | None = None,
    ) -> None:
        self.host = host
        self.socket = Path(socket)
        self.supervisor = supervisor
        self.node = node
        self.interval = interval
        self.lister = lister
        self.report = report
        self.done = done  # awaited with a resource whose handover the background check finished
        self._started: dict[str, float] = {}  # resource -> when its handover began (monotonic)
        self._driver: dict[str, str | None] = {}  # resource -> the DRA driver it leaves (None: it goes to DRA)
        self._wake = asyncio.Event()

    @property
    def moving(self) -> list[str]:
        """The resources whose handover is not done."""
        return sorted(self._started)

    def target(self, resource: str) -> str | None:
        """The api ``resource`` is being handed to (``dra``, ``device-plugin``), or None."""
        if resource not in self._started:
            return None
        return "dra" if self._driver[resource] is None else "device-plugin"

    async def begin(
        self, resources: Iterable[str], *, leaving_driver: Mapping[str, str] | None = None, at_start: bool = False
    ) -> None:
        """``resources`` just left one API for the other (the old front end stopped them): hold
        what pods hold, before the new front end serves them. ``leaving_driver`` (resource -> DRA
        driver) says they leave DRA for the device plugin; without it they go to DRA.

        ``at_start``: the daemon starts with them on the API ``leaving_driver`` says (a pod rolled
        with a new configuration, or restarted mid-handover, may follow one that served them
        through the other): held only where the kubelet answers that the other API's pods hold
        them; nothing is said otherwise."""
        names = [r for r in resources if r not in self._started]
        if not names:
            return
        for name in names:
            self._driver[name] = leaving_driver.get(name) if leaving_driver is not None else None
        try:
            allocated: AllocatedDevices | None = await self.lister(self.socket)
        except KubeletError as exc:
            if at_start:
                log.debug("no handover check at start: %s", exc)
                for name in names:
                    del self._driver[name]
                return
            log.warning("the kubelet's PodResources did not answer (%s): every device of %s stays held", exc, ", ".join(names))
            allocated = None
        if at_start:
            for name in [n for n in names if allocated is None or self._holding(n, allocated) == frozenset()]:
                del self._driver[name]
                names.remove(name)
        for name in names:
            self._started[name] = time.monotonic()
            if self._driver[name] is None:
                log.info("%s moves from the device plugin to DRA: the device plugin stopped advertising it", name)
            else:
                log.info("%s moves from DRA to the device plugin: the DRA driver %s stopped", name, self._driver[name])
            self._hold(name, allocated)
        if not self.supervisor.running(TASK):
            self.supervisor.spawn(TASK, self._run())
        self._wake.set()

    def cancel(self, resources: Iterable[str]) -> None:
        """``resources`` are no longer served by DRA (removed, or back to the device plugin)."""
        for name in resources:
            if self._started.pop(name, None) is not None:
                self._driver.pop(name, None)
                self.host.hold(name, frozenset(), HELD)
                log.info("%s: its handover ends unfinished (it moved again)", name)

    def _holding(self, name: str, allocated: AllocatedDevices) -> frozenset[str] | None:
        """The devices of ``name`` that pods of the API it leaves hold; None when claims hold some
        but the backend has not reported yet (a start), so which is not known."""
        driver = self._driver[name]
        if driver is None:
            return allocated.underlying(name)
        claimed = {c for c in allocated.of_driver(driver) if c.startswith(f"{self.node}/")}
        if not claimed:
            return frozenset()
        latest = self.host.latest(name)
        if latest is None:
            return None
        return frozenset(d.id for d in latest.devices if f"{self.node}/{dns_label_for(d.id)}" in claimed)

    def _hold(self, name: str, allocated: AllocatedDevices | None) -> None:
        driver = self._driver[name]
        if allocated is None:  # the kubelet did not answer: whatever pods hold, every device stays held
            latest = self.host.latest(name)
            if latest is None:  # nor has the backend reported (recreated by the same reload): all, as it reports them
                self.host.hold_all(name, HELD if driver is None else CLAIMED)
                return
            ids = frozenset(d.id for d in latest.devices)
        else:
            holding = self._holding(name, allocated)
            if holding is None:  # until the backend reports: every device, asked again each interval
                self.host.hold_all(name, CLAIMED)
                log.info(
                    "%s: claims of %s still used by running pods: every device held until its devices are known", name, driver
                )
                return
            ids = holding
        if ids == self.host.held(name) and ids:
            return
        self.host.hold(name, ids, HELD if driver is None else CLAIMED)
        if ids:
            if driver is None:
                message = (
                    f"{name}: {', '.join(sorted(ids))} still used by device-plugin pods: published to DRA tainted NoSchedule"
                )
            else:
                message = (
                    f"{name}: {', '.join(sorted(ids))} still used through {driver} claims: advertised Unhealthy to the kubelet"
                )
            log.info("%s", message)
            self.report("HandoverHeld", message)
        else:
            took = time.monotonic() - self._started.pop(name)
            self._driver.pop(name, None)
            message = f"{name}: no pod of the other API holds a device any more; every device is served ({took:.1f} s)"
            log.info("%s", message)
            self.report("HandoverDone", message)

    async def _run(self) -> None:
        while self._started:
            self._wake.clear()
            try:
                async with asyncio.timeout(self.interval):
                    await self._wake.wait()
            except TimeoutError:
                pass
            if not self._started:
                return
            try:
                allocated = await self.lister(self.socket)
            except KubeletError as exc:
                log.warning("handover waits for the kubelet's PodResources: %s", exc)
                continue
            for name in list(self._started):
                self._hold(name, allocated)
                if name not in self._started and self.done is not None:
                    await self.done(name)
