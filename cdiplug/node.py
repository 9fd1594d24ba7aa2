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
from collections.abc import Mapping, Sequence
from typing import Any

from cdiplug.backend import Backend, BackendPlugin
from cdiplug.config import Config, by_api
from cdiplug.frontend import FrontEnd, FrontEndParts, front_end_type, registered
from cdiplug.handover import Handover
from cdiplug.host import BackendHost
from cdiplug.host.backends import BACKOFF_INITIAL, BACKOFF_MAX
from cdiplug.kube.own_node import OwnNode
from cdiplug.models.resource import ResourceConfig
from cdiplug.models.world import World
from cdiplug.telemetry.recorder import NULL_RECORDER, Recorder
from cdiplug.toolkit.supervisor import Supervisor

log = logging.getLogger(__name__)


def spec_kinds(config: Config) -> list[str]:
    """The CDI kinds whose host-written specs stay: those of resources whose front end reads
    ``cdi_kind`` (the front ends serving the host's spec of a resource, the device plugin's)."""
    apis = registered()
    return [r.cdi_kind for r in config.resources if r.api in apis and "cdi_kind" in apis[r.api].settings]


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
    ) -> None:
        self.config = config
        self.own_node = own_node  # labels and Events on the Node (the daemon's; None: nothing asked of the API)
        self.world = world
        self.supervisor = supervisor
        self.recorder = recorder
        backoff = backoff if backoff is not None else (BACKOFF_INITIAL, BACKOFF_MAX)
        self.host = BackendHost(world, supervisor, plugins=plugins, recorder=recorder, backoff=backoff)
        self._parts = FrontEndParts(world, self.host, supervisor, recorder)
        self.handover = Handover(
            self.host, world.pod_resources_socket, supervisor, world.node_name, report=self._report, done=self._handover_done
        )
        # resource -> the CDI kind of its device-plugin spec, kept while device-plugin pods still
        # hold its devices after it moved to DRA (a container of theirs that restarts needs it).
        self._kept_kinds: dict[str, str] = {}
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
            self.recorder.configure(r.name for r in config.resources)
            self.host.create(config.resources)  # may raise: nothing runs yet
            if self.own_node is not None:
                self.host.observe(self.own_node.observe)
                self.own_node.configure(config, self.host)
            # A pod rolled with a new configuration may follow one whose device-plugin pods, or
            # whose DRA claims' pods, still run: what they hold is held before anything serves it.
            await self.handover.begin([r.name for r in config.resources if r.api == "dra"], at_start=True)
            self._kept_kinds = {r.name: r.cdi_kind for r in config.resources if r.name in self.handover.moving}
            await self.host.specs.remove_stale(self._spec_kinds())
            from_dra = {r.name: r.dra_driver for r in config.resources if r.api == "device-plugin"}
            await self.handover.begin(from_dra, leaving_driver=from_dra, at_start=True)
            groups = by_api(config)
            for api, resources in groups.items():
                await self._start_front_end(api, resources)
            # A front end no resource names may still have work an earlier run left (DRA: claims
            # the kubelet must unprepare through their driver).
            for registration in registered().values():
                if registration.api not in groups and any((self.world.own_state_dir / f).exists() for f in registration.state):
                    await self._start_front_end(registration.api, [])
            self.host.start()

    async def reload(self, config: Config) -> None:
        """Apply a new configuration; raises (changing nothing) when a new backend cannot be created."""
        async with self._lock:
            if self._stopped:
                return
            old = self.config.by_name()
            recreated = await self.host.reload(config.resources)
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
            # Between the device plugin and DRA: what the other API's pods still hold is held
            # before the new front end serves the resource.
            apis = {r.name: r.api for r in config.resources}
            self.handover.cancel(n for n in self.handover.moving if apis.get(n) != self.handover.target(n))
            to_dra = [n for n, api in apis.items() if api == "dra" and n in before.get("device-plugin", ())]
            await self.handover.begin(to_dra)
            self._kept_kinds.update({n: old[n].cdi_kind for n in to_dra})
            to_dp = {n: old[n].dra_driver for n, api in apis.items() if api == "device-plugin" and n in before.get("dra", ())}
            await self.handover.begin(to_dp, leaving_driver=to_dp)
            for api, resources in after.items():
                if api not in self._front_ends:
                    await self._start_front_end(api, resources)
                elif any(r.name not in before.get(api, ()) for r in resources):
                    await self._front_ends[api].reload(resources, frozenset())
            await self.host.specs.remove_stale(self._spec_kinds())

    def _spec_kinds(self) -> list[str]:
        """The CDI kinds whose host-written specs stay: the configured device-plugin resources',
        and those of resources moved to DRA while device-plugin pods still hold their devices."""
        self._kept_kinds = {n: k for n, k in self._kept_kinds.items() if self.handover.target(n) == "dra"}
        return spec_kinds(self.config) + sorted(self._kept_kinds.values())

    async def _handover_done(self, resource: str) -> None:
        async with self._lock:  # never beside a reload, which writes and sweeps specs itself
            if not self._stopped and resource in self._kept_kinds:
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
