"""One resource served as a DRA driver: its sockets, its slices and the snapshots feeding them.

:class:`DraDriver` is what the front end attaches to the backend host for a resource with
``api: dra`` (:meth:`offer` takes each snapshot on the event loop and never blocks):

- ``<plugins-dir>/<driver>/dra.sock`` serves ``v1.DRAPlugin``, ``v1beta1.DRAPlugin``
  (:mod:`.service`) and ``v1alpha1`` and ``v1beta1.DRAResourceHealth`` (:mod:`.health`: the whole
  pool on every change and every ``heartbeat`` seconds, inside the kubelet's 30 s window);
- ``<plugins-registry-dir>/<driver>-reg.sock`` serves plugin registration (:mod:`.registration`),
  started after ``dra.sock`` so the kubelet never finds a driver it cannot call;
- its :class:`~cdiplug.dra.publisher.SlicePublisher` runs as the supervised task
  ``dra-slices:<resource>`` and publishes each snapshot's devices.

A resource that leaves DRA while claims are prepared is drained (:meth:`DraDriver.drain`): its
slices go but its sockets stay until the kubelet has unprepared the last of them.

The boundary: the life of one driver; preparing claims is :mod:`.prepare`'s.
"""

from __future__ import annotations

import logging
from typing import Any

import grpc

from cdiplug.dra import health as health_service
from cdiplug.dra import registration, service
from cdiplug.dra.health import HEARTBEAT, HealthFeed
from cdiplug.dra.prepare import ClaimPreparer
from cdiplug.dra.publisher import SlicePublisher
from cdiplug.dra.settings import driver_of, socket_paths
from cdiplug.errors import CdiplugError
from cdiplug.models.devices import DeviceSnapshot
from cdiplug.models.resource import ResourceConfig
from cdiplug.models.world import World
from cdiplug.telemetry.recorder import NULL_RECORDER, Recorder
from cdiplug.toolkit.supervisor import Supervisor, SupervisorClosed
from cdiplug.wire.unixserver import UnixServer

log = logging.getLogger(__name__)


class DraDriver:
    """Serves one resource as its DRA driver (:func:`~cdiplug.dra.settings.driver_of`)."""

    def __init__(
        self,
        resource: ResourceConfig[Any],
        world: World,
        preparer: ClaimPreparer,
        publisher: SlicePublisher,
        supervisor: Supervisor,
        recorder: Recorder = NULL_RECORDER,
        heartbeat: float = HEARTBEAT,
    ) -> None:
        self.preparer = preparer
        self.resource = resource
        self.driver = driver_of(resource)
        self.world = world
        self.publisher = publisher
        self.supervisor = supervisor
        self.recorder = recorder
        self.health = HealthFeed(world.node_name, heartbeat, resource=resource.name, driver=self.driver, recorder=recorder)
        self.registrations = 0
        self.latest: DeviceSnapshot | None = None
        self.dra_socket, self.registration_socket = socket_paths(world, self.driver)
        self._dra_server = UnixServer(self.dra_socket, self._add_dra_services)
        reg = registration.RegistrationService(self.driver, self.dra_socket, service.SUPPORTED_VERSIONS, self._on_status)
        self._registration_server = UnixServer(self.registration_socket, lambda s: registration.add_to_server(s, reg))

    @property
    def resource(self) -> ResourceConfig[Any]:
        """The resource as configured now: one copy, the preparer's (a reload sets it here)."""
        return self.preparer.resource

    @resource.setter
    def resource(self, resource: ResourceConfig[Any]) -> None:
        self.preparer.resource = resource

    @property
    def name(self) -> str:
        return self.resource.name

    @property
    def slices_task(self) -> str:
        return f"dra-slices:{self.name}"

    @property
    def restore_task(self) -> str:
        return f"dra-restore:{self.name}"

    def _add_dra_services(self, server: grpc.aio.Server) -> None:
        service.add_to_server(server, self.preparer)
        health_service.add_to_server(server, self.health)

    # -- snapshots --

    def offer(self, snapshot: DeviceSnapshot) -> None:
        self.latest = snapshot
        healthy = snapshot.healthy_count()
        self.recorder.devices(self.name, healthy, len(snapshot.devices) - healthy, snapshot.unhealthy_causes())
        self.publisher.want(snapshot)
        self.health.update(snapshot)
        self.preparer.devices_known()
        if self.preparer.restore_pending and not self.supervisor.running(self.restore_task):
            # The first snapshot: the claims a reboot undid are prepared again (prepares wait).
            try:
                self.supervisor.spawn(self.restore_task, self.preparer.restore(snapshot))
            except SupervisorClosed:  # stopping: the next start restores
                pass

    # -- registration --

    def _on_status(self, registered: bool, error: str) -> None:
        if registered:
            self.recorder.registered(self.name, again=self.registrations > 0)
            self.registrations += 1
        else:
            self.recorder.set_ready(self.name, False)

    # -- lifecycle --

    async def start(self) -> None:
        """Serve both sockets (dra.sock first) and start publishing slices."""
        await self._dra_server.start()
        try:
            await self._registration_server.start()
        except BaseException:
            await self._dra_server.stop()
            raise
        self.supervisor.spawn(self.slices_task, self.publisher.run())
        log.info("serving %s as DRA driver %s on %s", self.name, self.driver, self.dra_socket, extra={"resource": self.name})

    async def drain(self) -> None:
        """Leave the node while claims are prepared: slices withdrawn and no longer published, no
        new claim prepared, but both sockets stay so that the kubelet can unprepare; :meth:`stop`
        once the preparer says none is left."""
        await self.supervisor.cancel(self.slices_task, self.restore_task)
        self.recorder.set_ready(self.name, False)
        try:
            await self.publisher.withdraw()
        except CdiplugError as exc:  # logged; the kubelet removes them after 30 s anyway
            log.warning("cannot delete the ResourceSlices of %s: %s", self.driver, exc)

    async def stop(self, withdraw: bool = False) -> None:
        """Stop serving; ``withdraw`` also deletes our slices (the resource left the configuration).

        Without it the slices stay: a restarted daemon takes them over, and the kubelet deletes
        them itself when the driver stays away (about 30 s after it unregistered).
        """
        await self._registration_server.stop()
        await self.supervisor.cancel(self.slices_task, self.restore_task)
        await self._dra_server.stop()
        self.recorder.set_ready(self.name, False)
        if withdraw:
            try:
                await self.publisher.withdraw()
            except CdiplugError as exc:  # logged; the kubelet removes them after 30 s anyway
                log.warning("cannot delete the ResourceSlices of %s: %s", self.driver, exc)
