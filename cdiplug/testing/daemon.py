"""The daemon of ``cdiplug serve``, run in the caller's event loop: :func:`running_daemon`, :func:`started_daemon`.

For tests (and the demo) that want the real daemon (configuration, backend host, front ends,
supervisor) without a process: it runs until the ``async with`` block ends, then stops cleanly.
A failure of the daemon (a backend told not to start empty, a broken core) is raised when the
block ends, or at once to a caller awaiting the yielded task. :func:`started_daemon` yields the
:class:`~cdiplug.daemon.Daemon` itself once it serves (for tests that reload it or look inside).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

from cdiplug.backend import BackendPlugin
from cdiplug.config import Config
from cdiplug.daemon import Daemon, serve
from cdiplug.models.world import World

STOP_TIMEOUT = 20.0


@contextlib.asynccontextmanager
async def running_daemon(
    config: Config | Path | str | None,
    world: World,
    *,
    plugins: Mapping[str, BackendPlugin[Any]] | None = None,
    metrics_address: str | None = None,
    timeout: float = STOP_TIMEOUT,
) -> AsyncIterator[asyncio.Task[int]]:
    """Serve ``config`` on ``world`` until the block ends; the daemon's task is yielded."""
    stop = asyncio.Event()
    task = asyncio.create_task(
        serve(config, world, metrics_address, plugins=plugins, stop=stop, handle_signals=False), name="cdiplug daemon"
    )
    try:
        yield task
    finally:
        stop.set()
        try:
            await asyncio.wait_for(task, timeout)
        except BaseException:
            task.cancel()
            raise


@contextlib.asynccontextmanager
async def started_daemon(config: Config | Path | str | None, world: World, *, timeout: float = 10.0) -> AsyncIterator[Daemon]:
    """The daemon of ``config`` on ``world``, yielded once every server serves; it must stop with status 0."""
    daemon = Daemon(config, world)
    task = asyncio.create_task(daemon.run(handle_signals=False), name="daemon under test")
    try:
        await asyncio.wait_for(daemon.started.wait(), timeout)
        yield daemon
    finally:
        daemon.request_stop()
        assert await asyncio.wait_for(task, timeout) == 0
