"""Every configured resource of this node: the backend host and the front ends standing on it.

:class:`Node` composes one :class:`~cdiplug.host.BackendHost` with one front end per ``api`` that
some resource names (whatever :mod:`cdiplug.frontend` has registered: the device plugin, DRA, or
one of a test's), each made on first need and serving the resources that name it, and applies a
configuration to all of them: at start, and again on reload, where backends and resources that
did not change are left alone.

The boundary: which front end serves what and in which order things start and stop; the daemon
(:mod:`cdiplug.daemon`) owns the process, signals and metrics serving; each front end owns how it
serves.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from cdiplug.backend import Backend, BackendPlugin
from cdiplug.config import Config, by_api
from cdiplug.frontend import FrontEnd, FrontEndParts, front_end_type, registered
from cdiplug.handover import Handover, Move
from cdiplug.host import BackendHost
from cdiplug.host.backends import BACKOFF_INITIAL, BACKOFF_MAX
from cdiplug.host.owners import Owners
from cdiplug.kube.factory import SharedClient
from cdiplug.models.instance import RESOURCE
from cdiplug.models.resource import ResourceConfig
from cdiplug.models.world import World
from cdiplug.telemetry.recorder import NULL_RECORDER, Recorder
from cdiplug.toolkit.supervisor import Supervisor

if TYPE_CHECKING:
    from cdiplug.kube.own_node import OwnNode

log = logging.getLogger(__name__)


def claims(config: Config) -> list[tuple[str, str]]:
    """What an instance serving ``config`` claims on the node (:mod:`cdiplug.host.owners`): every
    resource, and what each resource's front end names after it (DRA: its driver)."""
    return [(RESOURCE, r.name) for r in config.resources] + [
        name for r in config.resources for name in front_end_type(r.api).owned_names(r)
    ]


def spec_kinds(config: Config) -> list[str]:
    """The CDI kinds whose host-written specs stay: those of resources whose front end's consumers
    use the host's spec of a resource (the device plugin's)."""
    return [r.cdi_kind for r in config.resources if front_end_type(r.api).host_specs]


class Node:
    """Runs every resource of a :class:`Config`; ``start()``, ``reload(config)``, ``stop()``.

    Long-lived tasks run under ``supervisor``: when one fails the supervisor reports it and the
    caller stops the node. A failing backend never gets that far: the host restarts it.
    """

    def __init__(
        self,
        config: Config,
        world: World,
        supervisor: Supervisor,
        *,
        plugins: Mapping[str, BackendPlugin[Any]] | None = None,
        recorder: Recorder = NULL_RECORDER,
        backoff: tuple[float, float] | None = None,
        own_node: OwnNode | None = None,
        kube: SharedClient | None = None,
    ) -> None:
        self.config = config
        self.own_node = own_node  # labels and Events on the Node (the daemon's; None: nothing asked of the API)
        self.world = world
        self.supervisor = supervisor
        self.recorder = recorder
        backoff = backoff if backoff is not None else (BACKOFF_INITIAL, BACKOFF_MAX)
        self.host = BackendHost(world, supervisor, plugins=plugins, recorder=recorder, backoff=backoff)
        self.owners = Owners(world.state_dir, world.instance, world.pod_uid)
        # The process's one Kubernetes client (the daemon's; None: the node's own, closed when it stops).
        self._own_kube = kube is None
        self.kube = kube if kube is not None else SharedClient(world)
        self._parts = FrontEndParts(world, self.host, supervisor, recorder, self.kube)
        self.handover = Handover(self.host, world, supervisor, report=self._report, done=self._handover_done)
        self._front_ends: dict[str, FrontEnd] = {}  # by api, in the order they started
        self._lock = asyncio.Lock()
        self._stopped = False

    # -- introspection (tests, the demo) --

    @property
    def front_ends(self) -> Mapping[str, FrontEnd]:
        """The front ends made so far, by api: only those some configuration has named."""
        return dict(self._front_ends)

    def front_end(self, api: str) -> FrontEnd:
        """The front end of ``api`` (KeyError when none was made)."""
        return self._front_ends[api]

    def backend(self, plugin: str) -> Backend:
        return self.host.backend(plugin)

    # -- lifecycle --

    async def _start_front_end(self, api: str, resources: Sequence[ResourceConfig[object]]) -> None:
        # Kept before it starts, so that stop() stops what a failed start left running.
        front_end = self._front_ends[api] = front_end_type(api).create(self._parts)
        await front_end.start(resources)

    async def start(self) -> None:
        async with self._lock:
            config = self.config
            # Before anything is touched: another instance serving one of ours is an error.
            await asyncio.to_thread(self.owners.claim, claims(config))
            self.recorder.configure(r.name for r in config.resources)
            self.host.create(config.resources)  # may raise: nothing runs yet
            if self.own_node is not None:
                self.host.observe(self.own_node.observe)
                self.own_node.configure(config, self.host)
            # A pod rolled with a new configuration may follow one that served a resource through
            # another front end, whose consumers still run: what they hold is held before anything serves it.
            await self.handover.begin(self._earlier_apis(config), at_start=True)
            await self.host.specs.remove_stale(self._spec_kinds())
            groups = by_api(config)
            for api, resources in groups.items():
                await self._start_front_end(api, resources)
            # A front end no resource names may still have work an earlier run left (DRA: claims
            # the kubelet must unprepare through their driver).
            for api in registered():
                if api not in groups and any((self.world.own_state_dir / f).exists() for f in front_end_type(api).state):
                    await self._start_front_end(api, [])
            self.host.start()

    def _earlier_apis(self, config: Config) -> Iterator[Move]:
        """Each resource as every other front end that takes part in handovers would serve it."""
        for r in config.resources:
            plugin = self.host.plugins[r.backend]
            for api in registered():
                kind = front_end_type(api)
                if api != r.api and kind.hold_cause is not None:
                    settings = kind.settle(kind.settings(), r.name, plugin)
                    yield Move(ResourceConfig(r.name, r.backend, r.options, r.cdi_kind, api=api, settings=settings), r.api)

    async def reload(self, config: Config) -> None:
        """Apply a new configuration; raises (changing nothing) when a new backend cannot be created."""
        async with self._lock:
            if self._stopped:
                return
            old = self.config.by_name()
            await asyncio.to_thread(self.owners.claim, claims(config))  # may raise: nothing changed yet
            try:
                recreated = await self.host.reload(config.resources)
            except BaseException:
                await asyncio.to_thread(self.owners.keep_only, claims(self.config))
                raise
            before = {api: {r.name for r in group} for api, group in by_api(self.config).items()}
            after = by_api(config)
            self.config = config
            self.recorder.configure(r.name for r in config.resources)
            if self.own_node is not None:
                self.own_node.configure(config, self.host)
            # Leaving first, arriving second: a resource moving to another api is stopped (and
            # detached from the host) by its old front end before its new one attaches it.
            for api, front_end in self._front_ends.items():
                staying = [r for r in after.get(api, ()) if r.name in before.get(api, ())]
                await front_end.reload(staying, recreated)
            # Between front ends: what the old one's consumers still hold is held before the new
            # front end serves the resource.
            apis = {r.name: r.api for r in config.resources}
            self.handover.cancel(n for n in self.handover.moving if apis.get(n) != self.handover.target(n))
            await self.handover.begin(
                Move(old[r.name], r.api) for r in config.resources if r.name in old and old[r.name].api != r.api
            )
            for api, resources in after.items():
                if api not in self._front_ends:
                    await self._start_front_end(api, resources)
                elif any(r.name not in before.get(api, ()) for r in resources):
                    await self._front_ends[api].reload(resources, frozenset())
            await self.host.specs.remove_stale(self._spec_kinds())
            await asyncio.to_thread(self.owners.keep_only, claims(config))

    def _spec_kinds(self) -> list[str]:
        """The CDI kinds whose host-written specs stay: those of the configured resources whose
        front end uses them, and those of resources that left such a front end while its consumers
        still hold their devices (a container of theirs that restarts needs the spec)."""
        leaving = [r for n in self.handover.moving if (r := self.handover.leaving(n)) is not None]
        return spec_kinds(self.config) + sorted({r.cdi_kind for r in leaving if front_end_type(r.api).host_specs})

    async def _handover_done(self, left: ResourceConfig[object]) -> None:
        async with self._lock:  # never beside a reload, which writes and sweeps specs itself
            if not self._stopped and front_end_type(left.api).host_specs:
                await self.host.specs.remove_stale(self._spec_kinds())

    def _report(self, reason: str, message: str) -> None:
        if self.own_node is not None:
            self.own_node.event(reason, message)

    async def stop(self) -> None:
        async with self._lock:
            if self._stopped:
                return
            self._stopped = True
            for front_end in reversed(list(self._front_ends.values())):
                await front_end.stop()
            await self.host.stop()
            if self._own_kube:
                await self.kube.close()
            self.owners.close()
