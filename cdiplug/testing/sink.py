"""A recording SnapshotSink and a way to run a backend under test until it has reported.

For unit tests of a backend without the daemon: :class:`RecordingSink` keeps every snapshot
the backend publishes and lets a test await a condition on them (woken by each publish, never
polling); :func:`running` runs ``backend.run(sink)`` for the length of a ``with`` block, entering
it only once every resource has published and re-raising the backend's own error if it stops
first.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from cdiplug.backend import Backend
from cdiplug.models.devices import DeviceSnapshot
from cdiplug.models.resource import ResourceConfig

DEADLINE = 5.0


class BackendWithResources(Backend, Protocol):
    """A backend that keeps the resources it was made for (the bundled ones do)."""

    @property
    def resources(self) -> Sequence[ResourceConfig[object]]: ...


class RecordingSink:
    """Keeps ``history`` (every snapshot, in order) and ``latest`` (per resource)."""

    def __init__(self) -> None:
        self.history: list[DeviceSnapshot] = []
        self.latest: dict[str, DeviceSnapshot] = {}
        self._published = asyncio.Event()

    def publish(self, snapshot: DeviceSnapshot) -> None:
        self.history.append(snapshot)
        self.latest[snapshot.resource] = snapshot
        self._published.set()

    async def wait_for(self, condition: Callable[[Mapping[str, DeviceSnapshot]], Any], timeout: float = DEADLINE) -> None:
        """Return once ``condition(latest)`` holds; TimeoutError after ``timeout`` seconds."""
        async with asyncio.timeout(timeout):
            while not condition(self.latest):
                self._published.clear()
                await self._published.wait()

    async def until(
        self, resource: str, predicate: Callable[[DeviceSnapshot], bool] = lambda s: True, timeout: float = DEADLINE
    ) -> DeviceSnapshot:
        """The latest snapshot of ``resource`` once ``predicate`` holds for it."""
        await self.wait_for(lambda latest: resource in latest and predicate(latest[resource]), timeout)
        return self.latest[resource]

    def health(self, resource: str) -> dict[str, str]:
        """Device ID -> ``Healthy``/``Unhealthy`` in the latest snapshot of ``resource``."""
        return {d.id: d.health.value for d in self.latest[resource].devices}


@contextlib.asynccontextmanager
async def running(
    backend: BackendWithResources, sink: RecordingSink, resources: Iterable[str] | None = None, timeout: float = DEADLINE
) -> AsyncIterator[asyncio.Task[None]]:
    """Run ``backend`` until the block ends; ``resources`` (default: every one of the backend's)
    have published by the time the block is entered. Yields the backend's task."""
    if resources is None:
        resources = (r.name for r in backend.resources)
    wanted = set(resources)
    task = asyncio.create_task(backend.run(sink), name=f"test:{type(backend).__name__}")
    try:
        waiter = asyncio.create_task(sink.wait_for(lambda latest: wanted <= latest.keys(), timeout))
        done, _ = await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            waiter.cancel()
            task.result()  # the backend's own error, if it raised one
            raise AssertionError(f"the backend stopped before {', '.join(sorted(wanted - sink.latest.keys()))} published")
        waiter.result()
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
