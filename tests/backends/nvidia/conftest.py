"""Fixtures for the NVIDIA backend tests: a fake GPU machine laid into the ``world`` folders,
a sink that records snapshots and lets a test await a condition, and a running backend."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

import attrs
import pytest

from cdiplug.config import parse_config
from cdiplug.models.resource import ResourceConfig
from cdiplug.models.world import World
from cdiplug.testing.sink import RecordingSink
from cdiplug.testing.sink import running as run_backend
from cdiplug_backends.nvidia.backend import NvidiaBackend
from cdiplug_backends.nvidia.testing import FakeNvml


def resources(*entries: dict[str, Any]) -> tuple[ResourceConfig, ...]:
    """ResourceConfigs through the real config parser (so options are checked as users' are)."""
    return parse_config({"resources": [{"backend": "nvidia", **e} for e in entries]}).resources


@attrs.frozen
class GpuWorld(World):
    """A World and the fake NVML the backend under test is handed (the core's World has no NVML)."""

    nvml: Any = attrs.field(default=None, eq=False)


def machine(world: World, fake: FakeNvml) -> GpuWorld:
    """``world`` with the fake's sysfs ``numa_node`` files and ``/dev/nvidia*`` nodes laid out."""
    fake.write_sysfs(world.sysfs_root)
    fake.write_dev(world.dev_root)
    return GpuWorld(**attrs.asdict(world, recurse=False), nvml=fake)


def running(
    backend: NvidiaBackend, sink: RecordingSink, names: Sequence[str] | None = None
) -> AbstractAsyncContextManager[asyncio.Task[None]]:
    """Run the backend until the block ends; every resource (or ``names``) has published by then."""
    return run_backend(backend, sink, names)


@pytest.fixture
def sink() -> RecordingSink:
    return RecordingSink()


class Helpers:
    """The helpers above, as a fixture (test modules cannot import conftest under importlib mode)."""

    Sink = RecordingSink
    GpuWorld = GpuWorld
    resources = staticmethod(resources)
    machine = staticmethod(machine)
    running = staticmethod(running)

    @staticmethod
    def backend(res: Sequence[ResourceConfig], world: World) -> NvidiaBackend:
        return NvidiaBackend(res, world, nvml=getattr(world, "nvml", None), event_wait_ms=20)


@pytest.fixture
def nv() -> type[Helpers]:
    return Helpers
