"""The DRA front end: every resource with ``api: dra``, each served as a Kubernetes DRA driver.

Per resource a :class:`~cdiplug.dra.driver.DraDriver` (sockets, slices, health) with a
:class:`~cdiplug.dra.prepare.ClaimPreparer`, attached to the backend host like the device-plugin
front end's resources. Shared by all drivers: the process's one Kubernetes client (``parts.kube``,
:class:`~cdiplug.kube.factory.SharedClient`: made on first need, closed by whoever made it) and
one checkpoint of prepared claims (:class:`~cdiplug.dra.checkpoint.ClaimStore`).

- **start**: the checkpoint is read, claims an earlier run left half prepared are rolled back
  (:func:`~cdiplug.dra.rollback.roll_back_started`), claim specs it does not know are removed;
  every driver serves, registers and publishes; on its first snapshot, completed claims a
  reboot undid (another boot ID, a spec gone) are prepared and specced again before any
  prepare is answered (:meth:`~cdiplug.dra.prepare.ClaimPreparer.restore`).
- **reload**: drivers of removed resources stop and withdraw their slices; new ones start; a
  resource whose driver name changed is a removal and an addition; otherwise the driver stays
  and takes the new configuration (its backend may be new: the host replays its snapshot). A
  removed driver with claims still prepared is drained: its slices go at once, its sockets only
  once the kubelet has unprepared the last claim (a pod whose claim the kubelet cannot unprepare
  stays Terminating), and no new claim is prepared meanwhile.
- **stop**: sockets go away, slices and claim specs stay (running pods keep their devices; a
  restarted daemon takes over, and answers repeated prepares from the checkpoint).
- **configuration** (:data:`FRONT_END`, registered as ``api: dra``): driver names (DNS
  subdomains of at most 63 characters, one per resource) when the file is read; the driver's two
  socket paths (107 bytes) at start and every reload.

The boundary: what runs when, for DRA. Never imports :mod:`cdiplug.deviceplugin` (nor the
reverse); backends, preparation and the host are :mod:`cdiplug.host`'s.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from cdiplug.dra import claimspec, metadata
from cdiplug.dra.checkpoint import ClaimStore
from cdiplug.dra.driver import DraDriver
from cdiplug.dra.instances import InstanceLock
from cdiplug.dra.prepare import BOOT_ID, ClaimPreparer, NodeContext, read_boot_id
from cdiplug.dra.publisher import SlicePublisher
from cdiplug.dra.rollback import roll_back_started
from cdiplug.dra.settings import DraSettings, driver_of
from cdiplug.errors import CdiplugError
from cdiplug.frontend import FrontEndBase, FrontEndParts, changes
from cdiplug.host import BackendHost
from cdiplug.kube.client import KubeClient
from cdiplug.models.resource import Api, ResourceConfig
from cdiplug.toolkit.supervisor import SupervisorClosed

log = logging.getLogger(__name__)


class DraFrontEnd(FrontEndBase[BackendHost]):
    """Serves resources as DRA drivers; ``start(resources)``, ``reload(...)``, ``stop()``."""

    def __init__(self, parts: FrontEndParts[BackendHost, KubeClient]) -> None:
        super().__init__(parts)
        # The process's one Kubernetes client, made on first use (KubernetesError without credentials).
        self.client = parts.kube
        self.store = ClaimStore(self.world.own_state_dir)
        self._drivers: dict[str, DraDriver] = {}
        self._draining: dict[str, DraDriver] = {}  # by driver name: left the configuration, claims still prepared
        self.boot_id: str | None = None  # read at start (world.host_path: tests fake it)
        # With --pod-uid another instance may share our state (a rolling update): we say we run.
        self.instance = InstanceLock(self.world.own_state_dir, self.world.pod_uid) if self.world.pod_uid else None

    # -- introspection (tests) --

    @property
    def drivers(self) -> Mapping[str, DraDriver]:
        return dict(self._drivers)

    def driver(self, resource: str) -> DraDriver:
        return self._drivers[resource]

    @property
    def draining(self) -> Mapping[str, DraDriver]:
        """Drivers that left the configuration and serve only the unprepares of their claims, by driver name."""
        return dict(self._draining)

    # -- lifecycle --

    async def start(self, resources: Sequence[ResourceConfig[Any]]) -> None:
        """Serve every resource as a DRA driver; returns once all sockets are served."""
        async with self._lock:
            await self._start(resources)

    async def _start(self, resources: Sequence[ResourceConfig[Any]]) -> None:
        await self.store.load()
        left = self._left_behind(resources)
        if not resources and not left:
            return  # started only for the checkpoint, which holds nothing to finish
        try:
            self.client()  # credentials are a start-up matter: fail now, not at the first claim
        except CdiplugError as exc:
            if resources:
                raise
            drivers = ", ".join(driver_of(rc) for rc in left)
            log.error(
                "the checkpoint holds claims of DRA drivers no resource serves now (%s); cannot serve them: %s", drivers, exc
            )
            return
        if self.instance is not None:
            await asyncio.to_thread(self.instance.acquire)  # before we record any claim as ours
            await self.store.refresh()
        self.host.specs.guard_files(self.spec_wanted)
        self.boot_id = await asyncio.to_thread(read_boot_id, self.world.host_path(BOOT_ID))
        alive = self.instance.alive if self.instance is not None else (lambda owner: False)
        await roll_back_started(self.store, self.host, alive)  # before any driver serves
        async with self.store.locked():  # the other daemon of a rolling update records nothing meanwhile
            await self._remove_stale_specs()
            await self._remove_stale_metadata(resources)
        for rc in resources:
            self._drivers[rc.name] = self._new_driver(rc)
        try:
            for drv in self._drivers.values():
                await drv.start()
        except BaseException:
            await self._stop_all()
            raise
        for drv in self._drivers.values():
            self.host.attach(drv.name, drv)
        for rc in left:
            await self._drain_left_behind(rc)

    def _left_behind(self, resources: Sequence[ResourceConfig[Any]]) -> list[ResourceConfig[Any]]:
        """A resource per driver the checkpoint has claims of but no resource serves now (it left
        DRA while the daemon was down, or during a drain): the kubelet must still unprepare them."""
        served = {driver_of(rc) for rc in resources}
        by_driver = {c.driver: c.resource for c in self.store.all() if c.driver not in served}
        return [
            ResourceConfig(name, "", None, api=Api.DRA, settings=DraSettings(dra_driver=driver))
            for driver, name in sorted(by_driver.items())
        ]

    async def _drain_left_behind(self, rc: ResourceConfig[Any]) -> None:
        drv = self._new_driver(rc)
        try:
            await drv.start()
            await drv.drain()
        except CdiplugError as exc:
            log.error("cannot serve DRA driver %s for the unprepares of its claims: %s", driver_of(rc), exc)
            await drv.stop()
            return
        self._keep_draining(drv)

    def _claims_of(self, driver: str) -> int:
        return sum(c.driver == driver for c in self.store.all())

    def _keep_draining(self, drv: DraDriver) -> None:
        """``drv`` (drained already) serves the kubelet's unprepares until its last claim is gone."""
        self._draining[drv.driver] = drv
        log.info(
            "DRA driver %s of %s: slices withdrawn; it serves the kubelet until its %d prepared claims are unprepared",
            drv.driver,
            drv.name,
            self._claims_of(drv.driver),
            extra={"resource": drv.name},
        )
        drv.preparer.drain(functools.partial(self._drained, drv))

    async def _remove_stale_specs(self) -> None:
        """Claim specs the checkpoint does not know go; those it does are kept from now on."""
        keep = [c.uid for c in self.store.all()]
        try:
            removed = await claimspec.remove_stale(self.host.specs, keep)
        except CdiplugError as exc:
            log.error("cannot clean up old claim CDI specs: %s", exc)
            removed = []
        for path in removed:
            log.info("removed CDI spec %s (its claim is not prepared)", path)
        try:
            await claimspec.adopt(self.host.specs, [c.uid for c in self.store.all() if c.spec_file])
        except CdiplugError as exc:
            log.error("cannot keep the CDI specs of prepared claims: %s", exc)

    async def spec_wanted(self, name: str) -> bool:
        """Whether the claim spec ``name``, gone or changed, is to be written again (the CDI
        folder's watch asks): its claim is prepared, by this daemon or by one that no longer runs
        (in a rolling update the other pod keeps, or unprepares, its own claims' specs)."""
        uid = self.world.names.claim_uid(name)
        if uid is None:
            return False
        if self.instance is not None:
            await self.store.refresh()  # the other pod may have unprepared it
        record = self.store.get(uid)
        if record is None or not record.spec_file:
            return False
        if self.instance is None or not record.owner or record.owner == self.instance.instance:
            return True
        return not await asyncio.to_thread(self.instance.alive, record.owner)

    async def _remove_stale_metadata(self, resources: Sequence[ResourceConfig[Any]]) -> None:
        """Device metadata folders of claims the checkpoint does not know (a crash mid-prepare)."""
        keep = [(c.namespace, c.name) for c in self.store.all()]
        for rc in resources:
            for path in await asyncio.to_thread(metadata.remove_stale, self.world.plugins_dir, driver_of(rc), keep):
                log.info("removed device metadata %s (its claim is not prepared)", path)

    def _new_driver(self, rc: ResourceConfig[Any]) -> DraDriver:
        w = self.world
        node = NodeContext(w.node_name, boot_id=self.boot_id, plugins_dir=w.plugins_dir, instance=w.pod_uid or "")
        preparer = ClaimPreparer(rc, node, self.host, self.store, self.client, self.recorder)
        publisher = SlicePublisher(self.client(), driver_of(rc), node.name, resource=rc.name, recorder=self.recorder)
        return DraDriver(rc, self.world, preparer, publisher, self.supervisor, self.recorder)

    async def reload(self, resources: Sequence[ResourceConfig[Any]], recreated: frozenset[str]) -> None:
        """Serve ``resources`` from now on; ``recreated`` names those whose backend is new."""
        async with self._lock:
            if self._stopped:
                return
            # A renamed driver is another driver: the old one stops and withdraws its slices.
            diff = changes(
                {n: d.resource for n, d in self._drivers.items()},
                resources,
                recreated,
                restart=lambda old, new: driver_of(old) != driver_of(new),
            )
            for name in diff.removed:
                drv = self._drivers.pop(name)
                self.host.detach(drv.name)
                if diff.gone(name):
                    self.recorder.forget(drv.name)
                if not self._claims_of(drv.driver):
                    await drv.stop(withdraw=True)
                    log.info("stopped DRA driver %s of %s", drv.driver, drv.name)
                    continue
                await drv.drain()
                self._keep_draining(drv)
            for rc in diff.changed:
                current = self._drivers[rc.name]
                current.resource = rc
                self.host.attach(rc.name, current)  # the latest snapshot again, from a new backend maybe
            for rc in diff.added:
                if (left := self._draining.pop(driver_of(rc), None)) is not None:
                    await left.stop()  # the same driver again: the new one unprepares what it prepared
                drv = self._new_driver(rc)
                try:
                    await drv.start()
                except CdiplugError as exc:
                    log.error("cannot serve %s as DRA driver %s: %s", rc.name, driver_of(rc), exc, extra={"resource": rc.name})
                    continue
                self._drivers[rc.name] = drv
                self.host.attach(rc.name, drv)
                log.info("serving %s as DRA driver %s (added to the configuration)", rc.name, driver_of(rc))

    async def stop(self) -> None:
        async with self._lock:
            if self._stopped:
                return
            self._stopped = True
            await self._stop_all()
            if self.instance is not None:
                self.instance.release()  # nothing of ours is being prepared any more

    def _drained(self, drv: DraDriver) -> None:
        """Called by a draining driver's preparer (inside its last unprepare): stop it from a task."""
        try:
            self.supervisor.spawn(f"dra-drained:{drv.driver}", self._stop_drained(drv))
        except SupervisorClosed:  # stopping: stop() stops it
            pass

    async def _stop_drained(self, drv: DraDriver) -> None:
        async with self._lock:
            if self._draining.get(drv.driver) is not drv:
                return  # stopped meanwhile (the daemon stops, or the driver came back)
            del self._draining[drv.driver]
            await drv.stop()
        log.info("stopped DRA driver %s of %s: the kubelet has unprepared its last claim", drv.driver, drv.name)

    async def _stop_all(self) -> None:
        drivers = list(self._drivers.values())
        self._drivers.clear()
        for drv in drivers:
            self.host.detach(drv.name)
        draining = list(self._draining.values())
        self._draining.clear()
        await asyncio.gather(*(drv.stop() for drv in drivers + draining))
