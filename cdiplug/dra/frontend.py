"""The DRA front end: every resource with ``api: dra``, each served as a Kubernetes DRA driver.

Per resource a :class:`~cdiplug.dra.driver.DraDriver` (sockets, slices, health) with a
:class:`~cdiplug.dra.prepare.ClaimPreparer`, attached to the backend host like the device-plugin
front end's resources. Shared by all drivers: one Kubernetes client (made on first need by
``client_factory``, by default from ``world.kubeconfig`` / in-cluster / ``$KUBECONFIG``) and one
checkpoint of prepared claims (:class:`~cdiplug.dra.checkpoint.ClaimStore`).

- **start**: the checkpoint is read and claim specs it does not know are removed; every driver
  serves, registers and publishes.
- **reload**: drivers of removed resources stop and withdraw their slices; new ones start; a
  resource whose driver name changed is a removal and an addition; otherwise the driver stays
  and takes the new configuration (its backend may be new: the host replays its snapshot).
- **stop**: sockets go away, slices and claim specs stay (running pods keep their devices; a
  restarted daemon takes over, and answers repeated prepares from the checkpoint).

The boundary: what runs when, for DRA. Never imports :mod:`cdiplug.deviceplugin` (nor the
reverse); backends, preparation and the host are :mod:`cdiplug.host`'s.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..errors import CdiplugError
from ..host import BackendHost
from ..resource import ResourceConfig
from ..supervisor import Supervisor
from ..telemetry import NULL_RECORDER, Recorder
from ..world import World
from . import claimspec
from .checkpoint import ClaimStore
from .driver import DraDriver
from .kubeclient import KubeClient, connect
from .prepare import ClaimPreparer
from .publisher import SlicePublisher

log = logging.getLogger(__name__)

ClientFactory = Callable[[World], KubeClient]


def default_client(world: World) -> KubeClient:
    return connect(world.kubeconfig)


class DraFrontEnd:
    """Serves resources as DRA drivers; ``start(resources)``, ``reload(...)``, ``stop()``."""

    def __init__(
        self,
        world: World,
        host: BackendHost,
        supervisor: Supervisor,
        *,
        recorder: Recorder = NULL_RECORDER,
        client_factory: ClientFactory = default_client,
    ) -> None:
        self.world = world
        self.host = host
        self.supervisor = supervisor
        self.recorder = recorder
        self.client_factory = client_factory
        self.store = ClaimStore(world.state_dir)
        self._client: KubeClient | None = None
        self._drivers: dict[str, DraDriver] = {}
        self._lock = asyncio.Lock()
        self._started = False
        self._stopped = False

    # -- introspection (tests) --

    @property
    def drivers(self) -> Mapping[str, DraDriver]:
        return dict(self._drivers)

    def driver(self, resource: str) -> DraDriver:
        return self._drivers[resource]

    def client(self) -> KubeClient:
        """The shared Kubernetes client, made on first use (KubernetesError without credentials)."""
        if self._client is None:
            self._client = self.client_factory(self.world)
        return self._client

    # -- lifecycle --

    async def start(self, resources: Sequence[ResourceConfig[Any]]) -> None:
        """Serve every resource as a DRA driver; returns once all sockets are served."""
        async with self._lock:
            await self._start(resources)

    async def _start(self, resources: Sequence[ResourceConfig[Any]]) -> None:
        self._started = True
        self.client()  # credentials are a start-up matter: fail now, not at the first claim
        await self.store.load()
        await self._remove_stale_specs()
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

    async def _remove_stale_specs(self) -> None:
        keep = [c.uid for c in self.store.all()]
        try:
            removed = await asyncio.to_thread(claimspec.remove_stale, self.world.cdi_dir, keep)
        except CdiplugError as exc:
            log.error("cannot clean up old claim CDI specs: %s", exc)
            return
        for path in removed:
            log.info("removed CDI spec %s (its claim is not prepared)", path)

    def _new_driver(self, rc: ResourceConfig[Any]) -> DraDriver:
        node = self.world.node_name
        preparer = ClaimPreparer(rc, node, self.host, self.store, self.client, self.world.cdi_dir, self.recorder)
        publisher = SlicePublisher(self.client(), rc.dra_driver, node)
        return DraDriver(rc, self.world, preparer, publisher, self.supervisor, self.recorder)

    async def reload(self, resources: Sequence[ResourceConfig[Any]], recreated: frozenset[str]) -> None:
        """Serve ``resources`` from now on; ``recreated`` names those whose backend is new."""
        async with self._lock:
            if self._stopped:
                return
            if not self._started:  # the first DRA resource came with this configuration
                await self._start(resources)
                return
            wanted = {r.name: r for r in resources}
            gone = [d for n, d in self._drivers.items() if n not in wanted or wanted[n].dra_driver != d.driver]
            for drv in gone:
                del self._drivers[drv.name]
                self.host.detach(drv.name)
                await drv.stop(withdraw=True)
                if drv.name not in wanted:
                    self.recorder.forget(drv.name)
                log.info("stopped DRA driver %s of %s", drv.driver, drv.name)
            for rc in resources:
                current = self._drivers.get(rc.name)
                if current is not None:
                    if current.resource != rc or rc.name in recreated:
                        current.resource = rc
                        current.preparer.resource = rc
                        self.host.attach(rc.name, current)  # the latest snapshot again, from a new backend maybe
                    continue
                drv = self._new_driver(rc)
                try:
                    await drv.start()
                except CdiplugError as exc:
                    log.error("cannot serve %s as DRA driver %s: %s", rc.name, rc.dra_driver, exc, extra={"resource": rc.name})
                    continue
                self._drivers[rc.name] = drv
                self.host.attach(rc.name, drv)
                log.info("serving %s as DRA driver %s (added to the configuration)", rc.name, rc.dra_driver)

    async def stop(self) -> None:
        async with self._lock:
            if self._stopped:
                return
            self._stopped = True
            await self._stop_all()
            if self._client is not None:
                client, self._client = self._client, None
                await client.close()

    async def _stop_all(self) -> None:
        drivers = list(self._drivers.values())
        self._drivers.clear()
        for drv in drivers:
            self.host.detach(drv.name)
        await asyncio.gather(*(drv.stop() for drv in drivers))
