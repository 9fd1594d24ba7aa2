"""The backend host: creates, runs, restarts and reloads backends, and fans their snapshots out.

One backend runs per plugin, for all the resources that name it. The host:

- **fans out**: each snapshot a backend publishes is kept as the resource's latest, shown to the
  backend's :class:`~cdiplug.host.preparations.Preparations` (changed devices are prepared again)
  and offered to the one front end serving that resource (:meth:`BackendHost.attach`; the latest
  snapshot is replayed on attach, so start-up order does not matter), then to the node-wide
  observers (:meth:`BackendHost.observe`: node labels, health Events). Devices another API's pods
  still use (:meth:`BackendHost.hold`, a resource moving between the device plugin and DRA) are
  offered to the front end Unhealthy with the hold's cause;
- **isolates faults**: a backend whose ``run`` raises is logged and run again after a backoff
  (1 s doubling to 60 s; back to 1 s after a run that lasted a minute). While it is down, its
  resources keep their last devices, advertised Unhealthy (the kubelet admits no new pods to them;
  running pods keep theirs), and :meth:`BackendHost.down` names them for ``/readyz``. Other
  backends are never touched. Only :class:`~cdiplug.errors.BackendInitError` (a backend told not
  to start empty, ``fail_on_init_error``) is fatal: it ends the host's task and so the daemon;
- **owns preparation** (one :class:`Preparations` per backend) and the per-resource CDI spec
  files (:class:`~cdiplug.host.specs.SpecKeepers`);
- **reloads**: backends whose resources changed in any way are created anew; the others keep
  running untouched.

The boundary: the host knows backends and snapshots, never gRPC, the kubelet or Kubernetes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import attrs

from cdiplug.backend import Abilities, Backend, BackendPlugin, abilities_of, load_plugins
from cdiplug.errors import BackendInitError, CdiplugError
from cdiplug.host.preparations import Preparations
from cdiplug.host.specs import SpecKeepers
from cdiplug.models.devices import DeviceSnapshot, Health, HealthCause
from cdiplug.models.resource import ResourceConfig
from cdiplug.models.world import World
from cdiplug.telemetry.recorder import NULL_RECORDER, Recorder
from cdiplug.toolkit.backoff import Backoff
from cdiplug.toolkit.supervisor import Supervisor

log = logging.getLogger(__name__)

CDI_WATCH_TASK = "cdi-folder-watch"
BACKOFF_INITIAL = 1.0
BACKOFF_MAX = 60.0


class SnapshotListener(Protocol):
    """A front end's end of one resource: takes snapshots on the event loop, never blocks."""

    def offer(self, snapshot: DeviceSnapshot) -> None: ...


def group_by_backend(resources: Sequence[ResourceConfig[object]]) -> dict[str, tuple[ResourceConfig[object], ...]]:
    groups: dict[str, list[ResourceConfig[object]]] = {}
    for r in resources:
        groups.setdefault(r.backend, []).append(r)
    return {k: tuple(v) for k, v in groups.items()}


def all_unhealthy(snapshot: DeviceSnapshot) -> DeviceSnapshot:
    if all(not d.healthy for d in snapshot.devices):
        return snapshot
    return snapshot.with_devices(attrs.evolve(d, health=Health.UNHEALTHY) for d in snapshot.devices)


class _Sink:
    """Routes one backend's snapshots to the host while that backend is current."""

    def __init__(self, host: BackendHost, run: _BackendRun) -> None:
        self.host = host
        self.run = run
        self.active = True

    def publish(self, snapshot: DeviceSnapshot) -> None:
        if not self.active:
            return  # a replaced backend finishing up: its news is stale
        if snapshot.resource not in self.run.names:
            log.warning(
                "backend %s reported resource %s, which is not one of its own; ignored", self.run.plugin, snapshot.resource
            )
            return
        self.host._offer(self.run, snapshot)


class _BackendRun:
    def __init__(self, host: BackendHost, plugin: str, resources: tuple[ResourceConfig[object], ...], backend: Backend) -> None:
        self.plugin = plugin
        self.resources = resources
        self.names = frozenset(r.name for r in resources)
        self.backend = backend
        self.abilities: Abilities = abilities_of(backend)
        self.preparations = Preparations(plugin, self.abilities.preparer, self.abilities.unpreparer, host.recorder)
        self.sink = _Sink(host, self)
        self.down = False

    @property
    def task_name(self) -> str:
        return f"backend:{self.plugin}"


class BackendHost:
    """Runs the backends of a set of resources; ``create``, ``start``, ``reload``, ``stop``."""

    def __init__(
        self,
        world: World,
        supervisor: Supervisor,
        *,
        plugins: Mapping[str, BackendPlugin[Any]] | None = None,
        recorder: Recorder = NULL_RECORDER,
        specs: SpecKeepers | None = None,
        backoff: tuple[float, float] = (BACKOFF_INITIAL, BACKOFF_MAX),
    ) -> None:
        self.world = world
        self.supervisor = supervisor
        self.plugins = load_plugins() if plugins is None else plugins
        self.recorder = recorder
        self.specs = specs if specs is not None else SpecKeepers(world.cdi_dir, names=world.names)
        self.backoff = backoff
        self._runs: dict[str, _BackendRun] = {}  # by plugin
        self._by_resource: dict[str, _BackendRun] = {}
        self._latest: dict[str, DeviceSnapshot] = {}
        self._listeners: dict[str, SnapshotListener] = {}
        self._observers: list[Callable[[DeviceSnapshot], None]] = []
        # resource -> devices held elsewhere (None: every device, before we know which)
        self._held: dict[str, tuple[frozenset[str] | None, HealthCause]] = {}
        self._started = False

    # -- what front ends ask --

    def abilities(self, resource: str) -> Abilities:
        return self._by_resource[resource].abilities

    def preparations(self, resource: str) -> Preparations:
        return self._by_resource[resource].preparations

    def latest(self, resource: str) -> DeviceSnapshot | None:
        return self._latest.get(resource)

    def backend(self, plugin: str) -> Backend:
        return self._runs[plugin].backend

    def down(self) -> list[str]:
        """The resources whose backend is down (restarting), sorted."""
        return sorted(name for run in self._runs.values() if run.down for name in run.names)

    def attach(self, resource: str, listener: SnapshotListener) -> None:
        """``listener`` gets every snapshot of ``resource`` from now on, the latest one at once."""
        self._listeners[resource] = listener
        latest = self._latest.get(resource)
        if latest is not None:
            listener.offer(self._holding(latest))

    def hold(self, resource: str, device_ids: frozenset[str], cause: HealthCause) -> None:
        """Offer the devices ``device_ids`` of ``resource`` Unhealthy with ``cause`` to its front end
        until held again with fewer (none: as the backend reports them): what another API's pods
        still use (a resource moving from the device plugin to DRA). The latest snapshot is offered
        again at once."""
        if device_ids:
            self._held[resource] = (frozenset(device_ids), cause)
        elif self._held.pop(resource, None) is None:
            return
        self._offer_again(resource)

    def hold_all(self, resource: str, cause: HealthCause) -> None:
        """Offer every device of ``resource`` Unhealthy with ``cause`` (those it reports later too)
        until :meth:`hold` says which: another API's pods use some, and which is not known yet."""
        self._held[resource] = (None, cause)
        self._offer_again(resource)

    def _offer_again(self, resource: str) -> None:
        """The latest snapshot of ``resource`` to its front end again, as held now."""
        latest, listener = self._latest.get(resource), self._listeners.get(resource)
        if latest is not None and listener is not None:
            listener.offer(self._holding(latest))

    def held(self, resource: str) -> frozenset[str]:
        ids, _ = self._held.get(resource, (frozenset(), None))
        if ids is None:
            latest = self._latest.get(resource)
            return frozenset(d.id for d in latest.devices) if latest is not None else frozenset()
        return ids

    def _holding(self, snapshot: DeviceSnapshot) -> DeviceSnapshot:
        held = self._held.get(snapshot.resource)
        if held is None:
            return snapshot
        ids, cause = held
        devices = [
            attrs.evolve(d, health=Health.UNHEALTHY, health_cause=cause) if ids is None or d.id in ids else d
            for d in snapshot.devices
        ]
        return snapshot.with_devices(devices)

    def detach(self, resource: str) -> None:
        self._listeners.pop(resource, None)

    def observe(self, observer: Callable[[DeviceSnapshot], None]) -> None:
        """``observer`` sees every snapshot a backend reports, of every resource, after its front end
        (node-wide things: node labels, health events); it must not block."""
        self._observers.append(observer)

    # -- lifecycle --

    def create(self, resources: Sequence[ResourceConfig[object]]) -> None:
        """Create (not run) a backend per plugin; raises before anything changed when one fails."""
        runs = self._create(group_by_backend(resources))
        for run in runs:
            self._add(run)

    def start(self) -> None:
        """Run every created backend under the supervisor, and the CDI folder watch."""
        self._started = True
        for run in self._runs.values():
            self._spawn(run)
        self.supervisor.spawn(CDI_WATCH_TASK, self.specs.watch())

    async def stop(self) -> None:
        self._started = False
        await self.supervisor.cancel(CDI_WATCH_TASK)
        for run in self._runs.values():
            run.sink.active = False
        await self.supervisor.cancel(*(run.task_name for run in self._runs.values()))
        self._runs.clear()
        self._by_resource.clear()

    async def reload(self, resources: Sequence[ResourceConfig[object]]) -> frozenset[str]:
        """Recreate the backends whose resources changed; the names of the resources they serve.

        Raises (changing nothing) when a new backend cannot be created.
        """
        new_groups = group_by_backend(resources)
        changed = {p: rs for p, rs in new_groups.items() if p not in self._runs or self._runs[p].resources != rs}
        runs = self._create(changed)  # may raise: nothing has changed yet
        retired = [p for p in self._runs if p not in new_groups or p in changed]
        for plugin in retired:
            run = self._runs.pop(plugin)
            run.sink.active = False
            await self.supervisor.cancel(run.task_name)
            staying = {name for r in runs for name in r.names}
            for name in run.names:
                self._by_resource.pop(name, None)
                if name not in staying:  # one that stays keeps its last snapshot until the new backend reports
                    self._latest.pop(name, None)
            log.info("stopped backend %s", plugin)
        for run in runs:
            self._add(run)
            if self._started:
                self._spawn(run)
                log.info("started backend %s for %s", run.plugin, ", ".join(sorted(run.names)))
        return frozenset(name for run in runs for name in run.names)

    def _create(self, groups: Mapping[str, tuple[ResourceConfig[object], ...]]) -> list[_BackendRun]:
        runs = []
        for plugin, resources in groups.items():
            try:
                backend = self.plugins[plugin].create(resources, self.world)
            except CdiplugError:
                raise
            except Exception as exc:
                raise CdiplugError(f"backend {plugin} could not be created: {type(exc).__name__}: {exc}") from exc
            runs.append(_BackendRun(self, plugin, resources, backend))
        return runs

    def _add(self, run: _BackendRun) -> None:
        self._runs[run.plugin] = run
        for name in run.names:
            self._by_resource[name] = run

    def _spawn(self, run: _BackendRun) -> None:
        self.recorder.backend_started(run.plugin)
        self.supervisor.spawn(run.task_name, self._run_backend(run))

    # -- running --

    async def _run_backend(self, run: _BackendRun) -> None:
        loop = asyncio.get_running_loop()
        backoff = Backoff(*self.backoff)
        while True:
            started = loop.time()
            try:
                await run.backend.run(run.sink)
                # Returning is fine (a backend with nothing to watch); its last snapshots stay.
                log.debug("backend %s finished watching", run.plugin)
                return
            except BackendInitError:
                raise  # told not to start empty: the daemon stops (exit 2)
            except Exception as exc:
                if loop.time() - started >= backoff.cap:
                    backoff.reset()  # it ran well for a while: start the backoff afresh
                delay = next(backoff)
                detail = str(exc) if isinstance(exc, CdiplugError) else f"{type(exc).__name__}: {exc}"
                log.error(
                    "backend %s failed: %s; its resources stay registered with their devices Unhealthy; restarting in %g s",
                    run.plugin,
                    detail,
                    delay,
                    exc_info=None if isinstance(exc, CdiplugError) else exc,
                )
                self.recorder.backend_restarted(run.plugin)
                self._mark_down(run)
            await asyncio.sleep(delay)
            log.info("restarting backend %s", run.plugin)

    def _mark_down(self, run: _BackendRun) -> None:
        run.down = True
        for name in sorted(run.names):
            self.recorder.backend_down(name, True)
            latest = self._latest.get(name)
            listener = self._listeners.get(name)
            if latest is not None and listener is not None:
                listener.offer(all_unhealthy(self._holding(latest)))

    def _offer(self, run: _BackendRun, snapshot: DeviceSnapshot) -> None:
        if run.down:
            run.down = False
            for name in sorted(run.names):
                self.recorder.backend_down(name, False)
            log.info("backend %s is reporting again", run.plugin)
        self._latest[snapshot.resource] = snapshot
        run.preparations.on_snapshot(snapshot)
        listener = self._listeners.get(snapshot.resource)
        if listener is not None:
            listener.offer(self._holding(snapshot))
        for observer in self._observers:
            observer(snapshot)
