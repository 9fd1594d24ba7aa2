"""The device-plugin front end: every resource with ``api: device-plugin``, through the kubelet's lifecycle.

Per resource it runs a :class:`~cdiplug.deviceplugin.allocator.Allocator` and a
:class:`~cdiplug.deviceplugin.server.ResourceServer` on the snapshots the backend host hands it:

- **snapshots**: the host offers each resource's snapshots to its :class:`ServedResource`, whose
  updater task has the CDI spec written and publishes the list to ListAndWatch.
- **start**: servers serve, and only then is Register sent (one task per resource, waiting for
  the kubelet as long as it takes).
- **kubelet restarts** (:mod:`.kubelet_watch`): servers whose socket was removed serve again, old
  ListAndWatch streams end, every resource registers again.
- **release** (:mod:`.release`): devices a backend can unprepare are released through the host
  once the kubelet's PodResources API shows no pod holding them.
- **reload**: resources added, removed or changed start, stop or update; the others are not
  touched. Servers of resources that stay keep running and keep their streams.
- **configuration**: its settings and checks are :mod:`.settings` (registered as ``api: device-plugin``).

The boundary: this module decides what runs when; protobuf lives in :mod:`.server`, the Register
call in :mod:`.registration`; backends, preparation and spec files are the host's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from cdiplug.deviceplugin.allocator import Allocator
from cdiplug.deviceplugin.kubelet_watch import KubeletEvent, KubeletWatch
from cdiplug.deviceplugin.registration import Registration, register
from cdiplug.deviceplugin.release import Releaser
from cdiplug.deviceplugin.resource import ServedResource
from cdiplug.deviceplugin.server import ResourceServer
from cdiplug.deviceplugin.settings import settings_of
from cdiplug.errors import CdiplugError
from cdiplug.frontend import FrontEndBase, FrontEndParts, changes
from cdiplug.host import BackendHost
from cdiplug.models.resource import ResourceConfig

log = logging.getLogger(__name__)


class DevicePluginFrontEnd(FrontEndBase[BackendHost]):
    """Serves resources over the device-plugin API; ``start(resources)``, ``reload(...)``, ``stop()``.

    Long-lived tasks run under ``supervisor``; backends and preparation are ``host``'s. The lock
    also keeps the handling of kubelet restarts apart from those.
    """

    def __init__(self, parts: FrontEndParts[BackendHost, Any], *, register_timeout: float = 2.0) -> None:
        super().__init__(parts)
        self.register_timeout = register_timeout
        self._resources: dict[str, ServedResource] = {}
        self._watch: KubeletWatch | None = None
        self._releaser = Releaser(self.host, self.world.pod_resources_socket, self.supervisor)

    # -- introspection (tests, the daemon) --

    @property
    def resources(self) -> Mapping[str, ServedResource]:
        return dict(self._resources)

    def server(self, resource: str) -> ResourceServer:
        return self._resources[resource].server

    def allocator(self, resource: str) -> Allocator:
        return self._resources[resource].allocator

    # -- start and stop --

    async def start(self, resources: Sequence[ResourceConfig[object]]) -> None:
        """Serve every resource and start registering; returns once all servers are serving."""
        async with self._lock:
            self._ensure_kubelet_dir()
            # Armed before the first Register, so a kubelet restart in between is not missed.
            self._watch = KubeletWatch(self.world.kubelet_dir, self._serving_sockets)
            await self._watch.__aenter__()
            for rc in resources:
                self._resources[rc.name] = self._new_resource(rc)
            await asyncio.gather(*(r.server.start() for r in self._resources.values()))
            for res in self._resources.values():
                self.supervisor.spawn(res.updater_task, res.run_updates())
                self.host.attach(res.name, res)
                self._spawn_register(res)
            self.supervisor.spawn("kubelet-watch", self._watch_kubelet(self._watch))
            self._releaser.update(self._resources)
            self._releaser.start()

    async def stop(self) -> None:
        """Stop every task and server; our sockets are removed, CDI specs stay for running pods."""
        async with self._lock:
            if self._stopped:
                return
            self._stopped = True
            await self._releaser.stop()
            await self.supervisor.cancel("kubelet-watch")
            if self._watch is not None:
                await self._watch.__aexit__(None, None, None)
                self._watch = None
            resources = list(self._resources.values())
            await asyncio.gather(*(self._stop_resource(res) for res in resources))
            self._resources.clear()

    async def _stop_resource(self, res: ServedResource) -> None:
        self.host.detach(res.name)
        await self.supervisor.cancel(res.register_task, res.updater_task)
        await res.server.stop()
        self.recorder.set_ready(res.name, False)

    # -- resources --

    def _new_allocator(self, rc: ResourceConfig[object]) -> Allocator:
        return Allocator(
            rc,
            self.host.abilities(rc.name),
            self.host.preparations(rc.name),
            self.host.specs.keeper(rc.cdi_kind),
            self.recorder,
        )

    def _new_resource(self, rc: ResourceConfig[object]) -> ServedResource:
        allocator = self._new_allocator(rc)
        server = ResourceServer(rc.name, rc.socket_name, self.world.kubelet_dir, allocator)
        return ServedResource(rc, allocator, server, self.host.specs.keeper(rc.cdi_kind), self.recorder)

    def _ensure_kubelet_dir(self) -> None:
        """The kubelet creates its folder; we may be first (a node booting): create it then."""
        try:
            self.world.kubelet_dir.mkdir(mode=0o750, parents=True, exist_ok=True)
        except OSError as exc:
            raise CdiplugError(f"cannot create the kubelet folder {self.world.kubelet_dir}: {exc.strerror}") from exc

    def _serving_sockets(self) -> list[str]:
        return [r.server.socket_name for r in self._resources.values() if r.server.serving]

    # -- registration --

    def _spawn_register(self, res: ServedResource) -> None:
        self.supervisor.spawn(res.register_task, self._register(res))

    async def _register(self, res: ServedResource) -> None:
        if not settings_of(res.config).register_when_empty and not res.found.is_set():
            # A node without the hardware shows no `example.com/fpga: 0`: the kubelet hears of the
            # resource once a device is there. Nothing to serve counts as ready meanwhile.
            self.recorder.set_ready(res.name, True)
            await res.reported.wait()  # before the backend's first snapshot, "no devices" is not known
            if not res.found.is_set():
                log.info("%s: no devices found; registering it once one appears (register_when_empty: false)", res.name)
                await res.found.wait()
                log.info("%s: a device appeared; registering", res.name)
            self.recorder.set_ready(res.name, False)
        registration = Registration(
            resource_name=res.name,
            endpoint=res.server.socket_name,
            preferred_allocation=True,
        )
        await register(self.world.kubelet_socket, registration, timeout=self.register_timeout, asked=res.asked)
        self.recorder.registered(res.name, again=res.registrations > 0)
        res.registrations += 1

    async def _reregister(self, resources: Iterable[ServedResource], reserve: bool = False) -> None:
        """Register again: pending tries are dropped, old streams end first (re-serving if asked)."""

        async def one(res: ServedResource) -> None:
            await self.supervisor.cancel(res.register_task)
            self.recorder.set_ready(res.name, False)
            if reserve:
                await res.server.restart()
            else:
                res.server.end_streams()
            self._spawn_register(res)

        await asyncio.gather(*(one(res) for res in resources))

    async def _watch_kubelet(self, watch: KubeletWatch) -> None:
        async for event in watch:
            await self._on_kubelet_event(event)

    async def _on_kubelet_event(self, event: KubeletEvent) -> None:
        async with self._lock:
            if self._stopped:
                return
            if event.kubelet_restarted and not event.first_kubelet:
                self.recorder.kubelet_restart()
                log.info("the kubelet restarted; registering every resource again")
            elif event.kubelet_restarted:
                log.info("the kubelet is there now; registering every resource")
            gone = [r for r in self._resources.values() if r.server.socket_name in event.missing_sockets]
            if gone:
                self._ensure_kubelet_dir()  # the whole folder may have gone and not be back yet
                log.info("sockets removed: %s; serving them again", ", ".join(sorted(r.server.socket_name for r in gone)))
            await self._reregister(gone, reserve=True)
            if event.kubelet_restarted:
                await self._reregister([r for r in self._resources.values() if r not in gone])

    # -- reload --

    async def reload(self, resources: Sequence[ResourceConfig[object]], recreated: frozenset[str]) -> None:
        """Serve ``resources`` from now on; ``recreated`` names those whose backend is new.

        Resources that did not change and whose backend stayed are not touched. A resource whose
        server cannot start is logged and left off; the rest of the configuration applies.
        """
        async with self._lock:
            if self._stopped:
                return
            diff = changes({n: r.config for n, r in self._resources.items()}, resources, recreated)
            removed = [self._resources.pop(name) for name in diff.removed]
            await asyncio.gather(*(self._stop_resource(res) for res in removed))
            for res in removed:
                self.recorder.forget(res.name)
                log.info("stopped serving %s (removed from the configuration)", res.name)

            added: list[ServedResource] = []
            for rc in diff.added:
                res = self._resources[rc.name] = self._new_resource(rc)
                added.append(res)
            for rc in diff.changed:
                res = self._resources[rc.name]
                res.replace_allocator(rc, self._new_allocator(rc), self.host.specs.keeper(rc.cdi_kind))
                self.host.attach(rc.name, res)
            results = await asyncio.gather(*(res.server.start() for res in added), return_exceptions=True)
            for res, result in zip(list(added), results):
                if isinstance(result, BaseException):
                    if not isinstance(result, CdiplugError):
                        raise result
                    # The rest of the new configuration still applies; this one stays off.
                    log.error("cannot serve %s: %s", res.name, result, extra={"resource": res.name})
                    del self._resources[res.name]
                    added.remove(res)
            for res in added:
                self.supervisor.spawn(res.updater_task, res.run_updates())
                self.host.attach(res.name, res)
                self._spawn_register(res)
                log.info("serving %s (added to the configuration)", res.name)
            self._releaser.update(self._resources)
            self._releaser.start()
