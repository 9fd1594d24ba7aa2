"""The daemon: configuration, metrics, the node under a supervisor, and signals.

:func:`serve` is what ``cdiplug serve`` runs. It loads the configuration (a :class:`ConfigError`
propagates: the command line exits 2), builds :class:`~cdiplug.telemetry.metrics.Metrics` (only when an
address is given to serve them), starts the :class:`~cdiplug.node.Node` (the backend host and the front ends) and then waits:

- SIGTERM or SIGINT: a clean stop (tasks cancelled, servers stopped, our sockets removed); 0.
- SIGHUP: the configuration file is read again and applied (resources added, removed or changed
  start, stop or update; the others are left alone). A bad new configuration is logged with its
  message and the old one keeps running; so is any other failure of a reload (one line, the
  traceback at debug level): the daemon never ends because of a reload. SIGHUPs before the node
  is up (also those the early handlers of ``cdiplug.toolkit.signals`` caught) make one reload after start.
- a guarded task failing: everything stops cleanly and its error is raised to the caller.

The boundary: process-level concerns only; what runs is the node's business.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import linecache
import logging
import signal
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cdiplug.backend import BackendPlugin
from cdiplug.config import CONFIG_LABEL, Config, check_against, load_config
from cdiplug.errors import CdiplugError, ConfigError
from cdiplug.kube.factory import SharedClient
from cdiplug.kube.own_node import OwnNode
from cdiplug.models.world import World
from cdiplug.node import Node
from cdiplug.telemetry.recorder import NULL_RECORDER
from cdiplug.toolkit import signals
from cdiplug.toolkit.brief import brief
from cdiplug.toolkit.supervisor import Supervisor

if TYPE_CHECKING:
    from cdiplug.telemetry.metrics import Metrics

log = logging.getLogger(__name__)

CONFIG_LABEL_WAIT = 30.0  # seconds to read the node's configuration label at start


class Daemon:
    """One run of the daemon; :meth:`run` until :meth:`request_stop` (or SIGTERM/SIGINT)."""

    def __init__(
        self,
        config: Config | Path | str | None,
        world: World,
        *,
        metrics_address: str | None = None,
        plugins: Mapping[str, BackendPlugin[Any]] | None = None,
        metrics: Metrics | None = None,
        stop: asyncio.Event | None = None,
        own_node: Callable[[Supervisor, SharedClient], OwnNode] | None = None,
    ) -> None:
        # A path (re-read on SIGHUP), None (the built-in default) or a Config (embedding: the demo).
        self.config_source = config
        self.world = world
        self.metrics_address = metrics_address
        self.plugins = plugins
        if metrics is None and metrics_address:
            # Imported only when asked for: prometheus_client costs ~3.5 MiB of RSS, and nobody
            # reads the figures when they are not served.
            from cdiplug.telemetry.metrics import Metrics

            metrics = Metrics()
        self.metrics = metrics
        self.node: Node | None = None
        self.supervisor = Supervisor()
        self.started = asyncio.Event()  # set once every server is serving (registration may wait)
        self._stop = stop if stop is not None else asyncio.Event()
        self._reload = asyncio.Event()
        self._reloads_done = 0
        # The process's one Kubernetes client (made on first use), for the Node and the front ends.
        self.kube = SharedClient(world)
        # What is asked of the Node (labels, Events, the configuration label); tests give their API server.
        make_own_node = own_node if own_node is not None else functools.partial(OwnNode, world)
        self.own_node = make_own_node(self.supervisor, self.kube)
        self.configuration: str | None = None  # the named configuration the node label chose (None: default)

    def request_stop(self) -> None:
        self._stop.set()

    def request_reload(self) -> None:
        self._reload.set()

    @property
    def reloads_done(self) -> int:
        """How many reload requests have been handled (applied or refused)."""
        return self._reloads_done

    async def _load(self) -> Config:
        if isinstance(self.config_source, Config):
            config = self.config_source
        else:
            config = await asyncio.to_thread(load_config, self.config_source, self.plugins, self.configuration)
        check_against(config, self.world)
        return config

    async def _choose(self, config: Config) -> Config:
        """With named configurations, the one the node's label names (watched from now on)."""
        if not config.names or self.own_node.label_watch is not None:
            return config
        watch = self.own_node.watch_config_label(self._on_config_label)
        try:
            name = await watch.first(CONFIG_LABEL_WAIT)
        except TimeoutError:
            log.error(
                "node %s not read within %g s; serving configuration %r until its label %s is known",
                self.world.node_name,
                CONFIG_LABEL_WAIT,
                config.name,
                CONFIG_LABEL,
            )
            return config
        if name == self.configuration:
            return config
        self.configuration = name
        return await self._load()  # an unknown name: a ConfigError, exit 2 (nothing runs yet)

    def _on_config_label(self, name: str | None) -> None:
        log.info(
            "node label %s is now %s; applying that configuration", CONFIG_LABEL, name if name is not None else "unset (default)"
        )
        self.configuration = name
        self._reload.set()

    async def run(self, handle_signals: bool = True) -> int:
        loop = asyncio.get_running_loop()
        installed: list[signal.Signals] = []
        if handle_signals:
            # Installed first: a SIGTERM while starting up still means a clean stop.
            for sig, handler in (
                (signal.SIGTERM, self._on_stop_signal),
                (signal.SIGINT, self._on_stop_signal),
                (signal.SIGHUP, self._on_hup),
            ):
                loop.add_signal_handler(sig, handler, sig)
                installed.append(sig)
            for early in signals.take_pending():  # caught before the loop's handlers were in place
                (self._on_hup if early == signal.SIGHUP else self._on_stop_signal)(early)
        try:
            config = await self._choose(await self._load())  # ConfigError propagates: exit status 2
            log.info("configuration %s%s: %s", config.source, _named(config), ", ".join(r.name for r in config.resources))
            async with contextlib.AsyncExitStack() as stack:
                if self.metrics_address and self.metrics is not None:
                    await stack.enter_async_context(self.metrics.serve(self.metrics_address))
                recorder = self.metrics if self.metrics is not None else NULL_RECORDER
                node = self.node = Node(
                    config,
                    self.world,
                    self.supervisor,
                    plugins=self.plugins,
                    recorder=recorder,
                    own_node=self.own_node,
                    kube=self.kube,
                )
                try:
                    await node.start()
                    # attrs keeps the source of every method it generates in linecache, only for
                    # tracebacks to show (about 0.2 MiB of a daemon's idle memory): freed before the
                    # backends' first snapshots, which reuse it. A traceback through such a method
                    # then shows its line number alone; a file's lines are read again when needed.
                    linecache.clearcache()
                    # What start-up made (modules, classes, configuration) lives as long as the
                    # daemon: keep it out of the garbage collector's full passes, which would
                    # otherwise walk all of it again and again while Allocates wait.
                    gc.freeze()
                    self.started.set()
                    self.supervisor.spawn("reloader", self._reloader())
                    await self._wait_for_stop()
                finally:
                    await self.supervisor.close()
                    await node.stop()
        finally:
            await self.supervisor.close()  # the node label's watch may run before the node does
            await self.own_node.close()
            await self.kube.close()
            for installed_sig in installed:
                loop.remove_signal_handler(installed_sig)
            if installed:
                signals.reinstall()
        log.info("stopped cleanly")
        return 0

    def _on_stop_signal(self, sig: int) -> None:
        log.info("%s received; stopping", signal.Signals(sig).name)
        self._stop.set()

    def _on_hup(self, sig: int) -> None:
        log.info("SIGHUP received; reloading the configuration")
        self._reload.set()

    async def _wait_for_stop(self) -> None:
        stop = asyncio.create_task(self._stop.wait(), name="stop-signal")
        failure = asyncio.create_task(self.supervisor.wait(), name="supervisor")
        try:
            await asyncio.wait({stop, failure}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            if not failure.done():
                failure.cancel()
            await asyncio.gather(stop, failure, return_exceptions=True)
        if failure.done() and not failure.cancelled() and (exc := failure.exception()) is not None:
            raise exc

    async def _reloader(self) -> None:
        while True:
            await self._reload.wait()
            self._reload.clear()  # signals arriving during a reload coalesce into one more
            await self.reload()  # never raises but CancelledError

    async def reload(self) -> bool:
        """Read the configuration again and apply it; False (logged) when it is bad.

        Never raises (but ``CancelledError``): whatever goes wrong, the old configuration keeps running.
        """
        assert self.node is not None
        try:
            try:
                config = await self._choose(await self._load())
            except ConfigError as exc:
                log.error("configuration not reloaded, the old one keeps running: %s", exc)
                self.own_node.event(
                    "ConfigurationError", f"not reloaded, the old configuration keeps running: {exc}", warning=True
                )
                return False
            try:
                await self.node.reload(config)
            except CdiplugError as exc:
                log.error("configuration not applied, the old one keeps running: %s", exc)
                self.own_node.event(
                    "ConfigurationError", f"not applied, the old configuration keeps running: {exc}", warning=True
                )
                return False
            log.info("configuration reloaded%s: %s", _named(config), ", ".join(r.name for r in config.resources))
            self.own_node.event(
                "ConfigurationApplied", f"configuration{_named(config)}: {', '.join(r.name for r in config.resources)}"
            )
            return True
        except Exception as exc:  # a failure nobody foresaw must not end the daemon
            log.error(
                "configuration not reloaded, the old one keeps running: unexpected %s: %s",
                type(exc).__name__,
                brief(str(exc), 200),
            )
            log.debug("the unexpected reload failure", exc_info=exc)
            return False
        finally:
            self._reloads_done += 1


def _named(config: Config) -> str:
    return f" (named configuration {config.name!r})" if config.name is not None else ""


async def serve(
    config: Config | Path | str | None,
    world: World,
    metrics_address: str | None = None,
    *,
    plugins: Mapping[str, BackendPlugin[Any]] | None = None,
    stop: asyncio.Event | None = None,
    handle_signals: bool | None = None,
) -> int:
    """Run the daemon until SIGTERM/SIGINT (or ``stop`` is set); 0 after a clean stop.

    ``config`` is a file, None for the built-in default, or a ready :class:`Config` (embedding).
    Signal handlers are installed unless ``handle_signals`` is False; by default only when no
    ``stop`` event is given, so embedding callers keep their own SIGINT.
    """
    if handle_signals is None:
        handle_signals = stop is None
    daemon = Daemon(config, world, metrics_address=metrics_address, plugins=plugins, stop=stop)
    return await daemon.run(handle_signals)
