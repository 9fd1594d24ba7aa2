"""Named, guarded long-lived tasks: one failure takes everything down cleanly, never half-alive.

A :class:`Supervisor` owns the daemon's tasks (backends, registrations, the kubelet watch). A task
that ends normally or is cancelled simply leaves. A task that raises is logged with its name (and the
traceback, unless it is one of our own errors, whose message says what went wrong), every other task is cancelled and awaited, and :meth:`Supervisor.wait` raises that
first error to the caller, which decides the exit status (tasks never call ``sys.exit``).

The boundary: this module knows tasks, not what they do.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from types import TracebackType
from typing import Any, Self

from cdiplug.errors import CdiplugError

log = logging.getLogger(__name__)


class SupervisorClosed(CdiplugError):
    """A task was spawned after the supervisor was closed or had failed."""


class Supervisor:
    """Owns named tasks; ``async with Supervisor() as sup: sup.spawn(name, coro); await sup.wait()``."""

    def __init__(self, name: str = "cdiplug") -> None:
        self.name = name
        self._tasks: dict[str, asyncio.Task[Any]] = {}
        self._failure: BaseException | None = None
        self._failed_task: str | None = None
        self._done = asyncio.Event()
        self._closed = False

    # -- tasks --

    def spawn(self, name: str, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run ``coro`` as the task ``name``; a task of that name still running is an error."""
        if self._closed or self._failure is not None:
            coro.close()
            raise SupervisorClosed(f"cannot start task {name!r}: supervisor {self.name} is closed")
        old = self._tasks.get(name)
        if old is not None and not old.done():
            coro.close()
            raise RuntimeError(f"task {name!r} is already running")
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks[name] = task
        task.add_done_callback(self._on_done)
        return task

    def running(self, name: str) -> bool:
        task = self._tasks.get(name)
        return task is not None and not task.done()

    def names(self) -> list[str]:
        return sorted(n for n, t in self._tasks.items() if not t.done())

    async def join(self, name: str) -> None:
        """Wait until the task ``name`` has ended (at once when none runs); a failure is the supervisor's."""
        task = self._tasks.get(name)
        if task is not None:
            await asyncio.wait([task])

    async def cancel(self, *names: str) -> None:
        """Cancel the named tasks (missing ones are fine) and wait until they have ended."""
        tasks = [t for n in names if (t := self._tasks.get(n)) is not None and not t.done()]
        for task in tasks:
            task.cancel()
        await self._settle(tasks)

    def _on_done(self, task: asyncio.Task[Any]) -> None:
        name = task.get_name()
        if self._tasks.get(name) is task:
            del self._tasks[name]
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None:
            return
        if self._failure is not None or self._closed:
            # Already going down: a second failure is worth a line, not a second shutdown.
            log.error("task %s also failed: %s", name, exc, exc_info=exc)
            return
        # One of our errors says what went wrong in its message; anything else is a bug and
        # needs its traceback.
        log.error("task %s failed; stopping: %s", name, exc, exc_info=None if isinstance(exc, CdiplugError) else exc)
        self._failure = exc
        self._failed_task = name
        self._done.set()

    # -- the whole --

    @property
    def failure(self) -> BaseException | None:
        return self._failure

    @property
    def failed_task(self) -> str | None:
        return self._failed_task

    async def wait(self) -> None:
        """Wait until a task fails, cancel the others, then raise its error.

        Returns (without raising) only when :meth:`close` was called.
        """
        await self._done.wait()
        await self.close()
        if self._failure is not None:
            raise self._failure

    async def close(self) -> None:
        """Cancel every task and wait until all have ended."""
        self._closed = True
        self._done.set()
        while tasks := [t for t in self._tasks.values() if not t.done()]:
            for task in tasks:
                task.cancel()
            await self._settle(tasks)

    @staticmethod
    async def _settle(tasks: list[asyncio.Task[Any]]) -> None:
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()
