"""The manager: every configured resource served from one process, through the kubelet's lifecycle.

It runs one backend per plugin (all the resources naming that plugin share it) and, per resource,
an :class:`~cdiplug.allocator.Allocator` and a :class:`~cdiplug.server.ResourceServer`:

- **snapshots**: a backend's snapshots go to the resource they name, whose updater task
  (:mod:`cdiplug.served_resource`) writes its CDI spec and publishes it to ListAndWatch.
- **start**: stale CDI specs are removed, servers serve, and only then is Register sent (one task
  per resource, waiting for the kubelet as long as it takes).
- **kubelet restarts** (:mod:`cdiplug.kubelet_watch`): servers whose socket was removed serve
  again, old ListAndWatch streams end, every resource registers again.
- **reload**: resources added, removed or changed start, stop or update; the others are not
  touched. A backend whose resources changed in any way is recreated; servers of resources that
  stay keep running and keep their streams.

The boundary: the manager decides what runs when; protobuf lives in ``cdiplug.server``, the
Register call in ``cdiplug.registration``, task guarding in ``cdiplug.supervisor``, one
resource's snapshot pipeline in ``cdiplug.served_resource``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from .allocator import Allocator
from .backend import Abilities, Backend, BackendPlugin, abilities_of, load_plugins
from .cdi.writer import SpecWriter
from .config import Config, ResourceConfig, group_by_backend
from .errors import CdiError, CdiplugError
from .kubelet_watch import KubeletEvent, KubeletWatch
from .model import DeviceSnapshot
from .registration import Registration, register
from .served_resource import ServedResource
from .server import ResourceServer
from .supervisor import Supervisor
from .world import World

if TYPE_CHECKING:
    from .metrics import Metrics

log = logging.getLogger(__name__)


class _NoMetrics:
    """Stands in for Metrics where none is given (tests, embedding)."""

    def __getattr__(self, name: str):
        return lambda *args, **kwargs: None


class _Sink:
    """Routes one backend's snapshots to the manager while that backend is current."""

    def __init__(self, manager: Manager, backend: str, resources: Iterable[str]) -> None:
        self.manager = manager
        self.backend = backend
        self.resources = frozenset(resources)
        self.active = True

    def publish(self, snapshot: DeviceSnapshot) -> None:
        if not self.active:
            return  # a replaced backend finishing up: its news is stale
        if snapshot.resource not in self.resources:
            log.warning("backend %s reported resource %s, which is not one of its own; ignored", self.backend, snapshot.resource)
            return
        self.manager._offer(snapshot)


class _BackendRun:
    def __init__(self, plugin: str, resources: tuple[ResourceConfig, ...], backend: Backend, sink: _Sink) -> None:
        self.plugin = plugin
        self.resources = resources
        self.backend = backend
        self.abilities: Abilities = abilities_of(backend)
        self.sink = sink

    @property
    def task_name(self) -> str:
        return f"backend:{self.plugin}"


class Manager:
    """Runs every resource of a :class:`Config`; ``start()``, ``reload(config)``, ``stop()``.

    Long-lived tasks run under ``supervisor``: when one fails the supervisor reports it and the
    caller stops the manager.
    """

    def __init__(
        self,
        config: Config,
        world: World,
        supervisor: Supervisor,
        *,
        plugins: Mapping[str, BackendPlugin] | None = None,
        metrics: Metrics | None = None,
        cdi: SpecWriter | None = None,
        register_timeout: float = 2.0,
    ) -> None:
        self.config = config
        self.world = world
        self.supervisor = supervisor
        self.plugins = load_plugins() if plugins is None else plugins
        self.metrics: Metrics = metrics if metrics is not None else _NoMetrics()  # type: ignore[assignment]
        self.cdi = cdi if cdi is not None else SpecWriter(world.cdi_dir)
        self.register_timeout = register_timeout
        self._backends: dict[str, _BackendRun] = {}
        self._resources: dict[str, ServedResource] = {}
        self._watch: KubeletWatch | None = None
        self._lock = asyncio.Lock()  # start, reload, restart handling and stop, one at a time
        self._stopped = False

    # -- introspection (tests, the daemon) --

    @property
    def resources(self) -> Mapping[str, ServedResource]:
        return dict(self._resources)

    def server(self, resource: str) -> ResourceServer:
        return self._resources[resource].server

    def allocator(self, resource: str) -> Allocator:
        return self._resources[resource].allocator

    def backend(self, plugin: str) -> Backend:
        return self._backends[plugin].backend

    # -- start and stop --

    async def start(self) -> None:
        """Serve every resource and start registering; returns once all servers are serving."""
        async with self._lock:
            self.metrics.configure(r.name for r in self.config.resources)
            self._ensure_kubelet_dir()
            await self._remove_stale_specs(self.config)
            # Armed before the first Register, so a kubelet restart in between is not missed.
            self._watch = KubeletWatch(self.world.kubelet_dir, self._serving_sockets)
            await self._watch.__aenter__()
            runs = self._create_backends(group_by_backend(self.config.resources))
            for run in runs:
                for rc in run.resources:
                    self._resources[rc.name] = self._new_resource(rc, run.abilities)
            await asyncio.gather(*(r.server.start() for r in self._resources.values()))
            for res in self._resources.values():
                self.supervisor.spawn(res.updater_task, res.run_updates())
            for run in runs:
                self._start_backend(run)
            for res in self._resources.values():
                self._spawn_register(res)
            self.supervisor.spawn("kubelet-watch", self._watch_kubelet(self._watch))

    async def stop(self) -> None:
        """Stop every task and server; our sockets are removed, CDI specs stay for running pods."""
        async with self._lock:
            if self._stopped:
                return
            self._stopped = True
            await self.supervisor.cancel("kubelet-watch")
            if self._watch is not None:
                await self._watch.__aexit__(None, None, None)
                self._watch = None
            for run in self._backends.values():
                run.sink.active = False
            await self.supervisor.cancel(*(run.task_name for run in self._backends.values()))
            resources = list(self._resources.values())
            await asyncio.gather(*(self._stop_resource(res) for res in resources))
            self._backends.clear()
            self._resources.clear()

    async def _stop_resource(self, res: ServedResource) -> None:
        await self.supervisor.cancel(res.register_task, res.updater_task)
        await res.server.stop()
        self.metrics.set_ready(res.name, False)

    # -- backends and resources --

    def _create_backends(self, groups: Mapping[str, tuple[ResourceConfig, ...]]) -> list[_BackendRun]:
        """Create (not start) a backend per group; a failure raises before anything changed."""
        runs = []
        for plugin, resources in groups.items():
            try:
                backend = self.plugins[plugin].create(resources, self.world)
            except CdiplugError:
                raise
            except Exception as exc:
                raise CdiplugError(f"backend {plugin} could not be created: {type(exc).__name__}: {exc}") from exc
            runs.append(_BackendRun(plugin, resources, backend, _Sink(self, plugin, (r.name for r in resources))))
        return runs

    def _start_backend(self, run: _BackendRun) -> None:
        self._backends[run.plugin] = run
        self.supervisor.spawn(run.task_name, self._run_backend(run))

    async def _run_backend(self, run: _BackendRun) -> None:
        await run.backend.run(run.sink)
        # Returning is fine (a backend with nothing to watch); its last snapshots stay advertised.
        log.debug("backend %s finished watching", run.plugin)

    def _new_allocator(self, rc: ResourceConfig, abilities: Abilities) -> Allocator:
        return Allocator(rc, abilities, self.cdi, self.metrics if not isinstance(self.metrics, _NoMetrics) else None)

    def _new_resource(self, rc: ResourceConfig, abilities: Abilities) -> ServedResource:
        allocator = self._new_allocator(rc, abilities)
        server = ResourceServer(rc.name, rc.socket_name, self.world.kubelet_dir, allocator)
        return ServedResource(rc, allocator, server, self.cdi, self.metrics)

    def _ensure_kubelet_dir(self) -> None:
        """The kubelet creates its folder; we may be first (a node booting): create it then."""
        try:
            self.world.kubelet_dir.mkdir(mode=0o750, parents=True, exist_ok=True)
        except OSError as exc:
            raise CdiplugError(f"cannot create the kubelet folder {self.world.kubelet_dir}: {exc.strerror}") from exc

    def _serving_sockets(self) -> list[str]:
        return [r.server.socket_name for r in self._resources.values() if r.server.serving]

    # -- snapshots --

    def _offer(self, snapshot: DeviceSnapshot) -> None:
        res = self._resources.get(snapshot.resource)
        if res is not None:
            res.offer(snapshot)

    async def _remove_stale_specs(self, config: Config) -> None:
        try:
            removed = await asyncio.to_thread(self.cdi.remove_stale, [r.cdi_kind for r in config.resources])
        except CdiError as exc:
            log.error("cannot clean up old CDI specs: %s", exc)
            return
        for path in removed:
            log.info("removed CDI spec %s (its resource is no longer configured)", path)

    # -- registration --

    def _spawn_register(self, res: ServedResource) -> None:
        self.supervisor.spawn(res.register_task, self._register(res))

    async def _register(self, res: ServedResource) -> None:
        registration = Registration(
            resource_name=res.name,
            endpoint=res.server.socket_name,
            pre_start_required=res.server.pre_start_required,
            preferred_allocation=True,
        )
        await register(self.world.kubelet_socket, registration, timeout=self.register_timeout)
        self.metrics.registered(res.name, again=res.registrations > 0)
        res.registrations += 1

    async def _reregister(self, resources: Iterable[ServedResource], reserve: bool = False) -> None:
        """Register again: pending tries are dropped, old streams end first (re-serving if asked)."""

        async def one(res: ServedResource) -> None:
            await self.supervisor.cancel(res.register_task)
            self.metrics.set_ready(res.name, False)
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
                self.metrics.kubelet_restart()
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

    async def reload(self, config: Config) -> None:
        """Apply a new configuration; resources and backends that did not change are not touched.

        Raises (changing nothing) when a new backend cannot be created.
        """
        async with self._lock:
            if self._stopped:
                return
            old_groups = {run.plugin: run.resources for run in self._backends.values()}
            new_groups = dict(group_by_backend(config.resources))
            changed = {p: rs for p, rs in new_groups.items() if old_groups.get(p) != rs}
            runs = self._create_backends(changed)  # may raise: nothing has changed yet
            new_names = {r.name for r in config.resources}
            retired = [p for p in old_groups if p not in new_groups or p in changed]

            for plugin in retired:
                run = self._backends.pop(plugin)
                run.sink.active = False
                await self.supervisor.cancel(run.task_name)
                log.info("stopped backend %s", plugin)
            removed = [r for n, r in self._resources.items() if n not in new_names]
            for res in removed:
                del self._resources[res.name]
            await asyncio.gather(*(self._stop_resource(res) for res in removed))
            for res in removed:
                self.metrics.forget(res.name)
                log.info("stopped serving %s (removed from the configuration)", res.name)

            self.config = config
            self.metrics.configure(new_names)
            added: list[ServedResource] = []
            tell_kubelet: list[ServedResource] = []
            for run in runs:
                for rc in run.resources:
                    res = self._resources.get(rc.name)
                    if res is None:
                        res = self._resources[rc.name] = self._new_resource(rc, run.abilities)
                        added.append(res)
                    elif res.replace_allocator(rc, self._new_allocator(rc, run.abilities)):
                        tell_kubelet.append(res)
            # The kubelet learns a plugin's options only at Register: tell it again.
            await self._reregister(tell_kubelet)
            results = await asyncio.gather(*(res.server.start() for res in added), return_exceptions=True)
            for res, result in zip(list(added), results):
                if isinstance(result, BaseException):
                    if not isinstance(result, CdiplugError):
                        raise result
                    # The rest of the new configuration still applies; this one stays off.
                    res.log.error("cannot serve %s: %s", res.name, result)
                    del self._resources[res.name]
                    added.remove(res)
            for res in added:
                self.supervisor.spawn(res.updater_task, res.run_updates())
                self._spawn_register(res)
                log.info("serving %s (added to the configuration)", res.name)
            for run in runs:
                self._start_backend(run)
                log.info("started backend %s for %s", run.plugin, ", ".join(r.name for r in run.resources))
            await self._remove_stale_specs(config)
