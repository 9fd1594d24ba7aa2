"""Fixtures for the NVIDIA backend tests: a fake GPU machine laid into the ``world`` folders,
a sink that records snapshots and lets a test await a condition, and a running backend."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

import attrs
import pytest

from backends.nvidia.backend import NvidiaBackend
from cdiplug.config import ResourceConfig, parse_config
from cdiplug.model import DeviceSnapshot
from cdiplug.testing import FakeNvml
from cdiplug.world import World


class RecordingSink:
    """A SnapshotSink keeping every snapshot; ``wait_for`` awaits a condition on the latest ones."""

    def __init__(self) -> None:
        self.snapshots: list[DeviceSnapshot] = []
        self.latest: dict[str, DeviceSnapshot] = {}
        self._published = asyncio.Event()

    def publish(self, snapshot: DeviceSnapshot) -> None:
        self.snapshots.append(snapshot)
        self.latest[snapshot.resource] = snapshot
        self._published.set()

    async def wait_for(self, condition: Callable[[Mapping[str, DeviceSnapshot]], Any], timeout: float = 5.0) -> None:
        async with asyncio.timeout(timeout):
            while not condition(self.latest):
                self._published.clear()
                await self._published.wait()

    def health(self, resource: str) -> dict[str, str]:
        snap = self.latest[resource]
        return {d.id: d.health.value for d in snap.devices}


def resources(*entries: dict[str, Any]) -> tuple[ResourceConfig, ...]:
    """ResourceConfigs through the real config parser (so options are checked as users' are)."""
    return parse_config({"resources": [{"backend": "nvidia", **e} for e in entries]}).resources


def machine(world: World, fake: FakeNvml) -> World:
    """``world`` with the fake's sysfs ``numa_node`` files and ``/dev/nvidia*`` nodes laid out."""
    fake.write_sysfs(world.sysfs_root)
    fake.write_dev(world.dev_root)
    return attrs.evolve(world, nvml=fake)


@contextlib.asynccontextmanager
async def running(backend: NvidiaBackend, sink: RecordingSink, names: Sequence[str] | None = None) -> AsyncIterator[asyncio.Task[None]]:
    """Run the backend until the block ends; every resource (or ``names``) has published by then."""
    task = asyncio.create_task(backend.run(sink), name="test:nvidia")
    wanted = set(names if names is not None else (r.name for r in backend.resources))
    try:
        waiter = asyncio.create_task(sink.wait_for(lambda latest: wanted <= latest.keys()))
        done, _ = await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            waiter.cancel()
            task.result()  # the backend's own error
            raise AssertionError("the backend stopped before publishing")
        waiter.result()
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@pytest.fixture
def sink() -> RecordingSink:
    return RecordingSink()


class Helpers:
    """The helpers above, as a fixture (test modules cannot import conftest under importlib mode)."""

    Sink = RecordingSink
    resources = staticmethod(resources)
    machine = staticmethod(machine)
    running = staticmethod(running)

    @staticmethod
    def backend(res: Sequence[ResourceConfig], world: World) -> NvidiaBackend:
        return NvidiaBackend(res, world, event_wait_ms=20)


@pytest.fixture
def nv() -> type[Helpers]:
    return Helpers
