"""One resource served as a DRA driver: its sockets, its slices and the snapshots feeding them.

:class:`DraDriver` is what the front end attaches to the backend host for a resource with
``api: dra`` (:meth:`offer` takes each snapshot on the event loop and never blocks):

- ``<plugins-dir>/<driver>/dra.sock`` serves ``v1.DRAPlugin``, ``v1beta1.DRAPlugin``
  (:mod:`.service`) and ``v1alpha1.DRAResourceHealth`` (:mod:`.health`);
- ``<plugins-registry-dir>/<driver>-reg.sock`` serves plugin registration (:mod:`.registration`),
  started after ``dra.sock`` so the kubelet never finds a driver it cannot call;
- its :class:`~cdiplug.dra.publisher.SlicePublisher` runs as the supervised task
  ``dra-slices:<resource>`` and publishes each snapshot's devices.

The boundary: the life of one driver; preparing claims is :mod:`.prepare`'s.
"""

from __future__ import annotations

import logging
from typing import Any

import grpc

from ..errors import CdiplugError
from ..model import DeviceSnapshot
from ..resource import ResourceConfig
from ..supervisor import Supervisor
from ..telemetry import NULL_RECORDER, Recorder
from ..unixserver import UnixServer
from ..world import World
from . import health as health_service
from . import registration, service
from .health import HealthFeed
from .prepare import ClaimPreparer
from .publisher import SlicePublisher

log = logging.getLogger(__name__)


class DraDriver:
    """Serves one resource as the DRA driver ``resource.dra_driver``."""

    def __init__(
        self,
        resource: ResourceConfig[Any],
        world: World,
        preparer: ClaimPreparer,
        publisher: SlicePublisher,
        supervisor: Supervisor,
        recorder: Recorder = NULL_RECORDER,
    ) -> None:
        self.resource = resource
        self.driver = resource.dra_driver
        self.world = world
        self.preparer = preparer
        self.publisher = publisher
        self.supervisor = supervisor
        self.recorder = recorder
        self.health = HealthFeed(world.node_name)
        self.registrations = 0
        self.latest: DeviceSnapshot | None = None
        self.dra_socket = world.plugins_dir / self.driver / "dra.sock"
        self.registration_socket = world.plugins_registry_dir / f"{self.driver}-reg.sock"
        self._dra_server = UnixServer(self.dra_socket, self._add_dra_services)
        reg = registration.RegistrationService(self.driver, self.dra_socket, service.SUPPORTED_VERSIONS, self._on_status)
        self._registration_server = UnixServer(self.registration_socket, lambda s: registration.add_to_server(s, reg))

    @property
    def name(self) -> str:
        return self.resource.name

    @property
    def slices_task(self) -> str:
        return f"dra-slices:{self.name}"

    def _add_dra_services(self, server: grpc.aio.Server) -> None:
        service.add_to_server(server, self.preparer)
        health_service.add_to_server(server, self.health)

    # -- snapshots --

    def offer(self, snapshot: DeviceSnapshot) -> None:
        self.latest = snapshot
        self.recorder.devices(self.name, snapshot.healthy_count(), len(snapshot.devices) - snapshot.healthy_count())
        self.publisher.want(snapshot)
        self.health.update(snapshot)

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

    async def stop(self, withdraw: bool = False) -> None:
        """Stop serving; ``withdraw`` also deletes our slices (the resource left the configuration).

        Without it the slices stay: a restarted daemon takes them over, and the kubelet deletes
        them itself when the driver stays away (about 30 s after it unregistered).
        """
        await self._registration_server.stop()
        await self.supervisor.cancel(self.slices_task)
        await self._dra_server.stop()
        self.recorder.set_ready(self.name, False)
        if withdraw:
            try:
                await self.publisher.withdraw()
            except CdiplugError as exc:  # logged; the kubelet removes them after 30 s anyway
                log.warning("cannot delete the ResourceSlices of %s: %s", self.driver, exc)
