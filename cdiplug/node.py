"""Every configured resource of this node: the backend host and the front ends standing on it.

:class:`Node` composes one :class:`~cdiplug.host.BackendHost` with the device-plugin front end
(:mod:`cdiplug.deviceplugin`) and the DRA front end (:mod:`cdiplug.dra`), each serving the
resources whose ``api`` names it, and applies a configuration to all of them: at start, and again
on reload, where backends and resources that did not change are left alone.

The boundary: which front end serves what and in which order things start and stop; the daemon
(:mod:`cdiplug.daemon`) owns the process, signals and metrics serving.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .backend import Backend, BackendPlugin
from .config import Config
from .deviceplugin.allocator import Allocator
from .deviceplugin.frontend import DevicePluginFrontEnd
from .deviceplugin.resource import ServedResource
from .deviceplugin.server import ResourceServer
from .host import BackendHost
from .host.backends import BACKOFF_INITIAL, BACKOFF_MAX
from .resource import Api, ResourceConfig
from .supervisor import Supervisor
from .telemetry import NULL_RECORDER, Recorder
from .world import World

if TYPE_CHECKING:
    from .dra.frontend import ClientFactory, DraFrontEnd

log = logging.getLogger(__name__)


def served_by(config: Config, api: Api) -> list[ResourceConfig[object]]:
    return [r for r in config.resources if r.api is api]


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
        register_timeout: float = 2.0,
        backoff: tuple[float, float] | None = None,
        kube_client_factory: ClientFactory | None = None,
    ) -> None:
        self.config = config
        self.world = world
        self.supervisor = supervisor
        self.recorder = recorder
        backoff = backoff if backoff is not None else (BACKOFF_INITIAL, BACKOFF_MAX)
        self.host = BackendHost(world, supervisor, plugins=plugins, recorder=recorder, backoff=backoff)
        self.device_plugin = DevicePluginFrontEnd(
            world, self.host, supervisor, recorder=recorder, register_timeout=register_timeout
        )
        self.dra: DraFrontEnd | None = None
        self._kube_client_factory = kube_client_factory
        self._lock = asyncio.Lock()
        self._stopped = False

    def _dra(self) -> DraFrontEnd:
        """The DRA front end, made on first need: only then is the Kubernetes client imported."""
        if self.dra is None:
            from .dra.frontend import DraFrontEnd

            extra = {"client_factory": self._kube_client_factory} if self._kube_client_factory is not None else {}
            self.dra = DraFrontEnd(self.world, self.host, self.supervisor, recorder=self.recorder, **extra)
        return self.dra

    # -- introspection (tests, the demo) --

    @property
    def resources(self) -> Mapping[str, ServedResource]:
        return self.device_plugin.resources

    def server(self, resource: str) -> ResourceServer:
        return self.device_plugin.server(resource)

    def allocator(self, resource: str) -> Allocator:
        return self.device_plugin.allocator(resource)

    def backend(self, plugin: str) -> Backend:
        return self.host.backend(plugin)

    # -- lifecycle --

    def _kinds(self, config: Config) -> Sequence[str]:
        return [r.cdi_kind for r in served_by(config, Api.DEVICE_PLUGIN)]

    async def start(self) -> None:
        async with self._lock:
            config = self.config
            self.recorder.configure(r.name for r in config.resources)
            await self.host.specs.remove_stale(self._kinds(config))
            self.host.create(config.resources)  # may raise: nothing runs yet
            await self.device_plugin.start(served_by(config, Api.DEVICE_PLUGIN))
            if served_by(config, Api.DRA):
                await self._dra().start(served_by(config, Api.DRA))
            self.host.start()

    async def reload(self, config: Config) -> None:
        """Apply a new configuration; raises (changing nothing) when a new backend cannot be created."""
        async with self._lock:
            if self._stopped:
                return
            recreated = await self.host.reload(config.resources)
            self.config = config
            self.recorder.configure(r.name for r in config.resources)
            await self.device_plugin.reload(served_by(config, Api.DEVICE_PLUGIN), recreated)
            if served_by(config, Api.DRA) or self.dra is not None:
                await self._dra().reload(served_by(config, Api.DRA), recreated)
            await self.host.specs.remove_stale(self._kinds(config))

    async def stop(self) -> None:
        async with self._lock:
            if self._stopped:
                return
            self._stopped = True
            await self.device_plugin.stop()
            if self.dra is not None:
                await self.dra.stop()
            await self.host.stop()
