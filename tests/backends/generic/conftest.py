"""Fixtures of the generic backend tests: a fake /dev and USB sysfs tree in the test's World,
resources parsed through the real config loader, and a fake udev monitor."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from cdiplug.config import parse_config
from cdiplug.models.resource import ResourceConfig
from cdiplug.models.world import World
from cdiplug.testing.sink import RecordingSink
from cdiplug.testing.sink import running as run_backend
from cdiplug_backends.generic import GenericBackend, plugin
from cdiplug_backends.generic.testing import ClassNode, FakeDev, FakeUdevMonitor, UsbTree

DEADLINE = 5.0
FTDI = ("0403", "6001")


def resources(*specs: tuple[str, dict[str, Any]], api: str | None = None) -> tuple[ResourceConfig, ...]:
    data = {"resources": [{"name": n, "backend": "generic", "options": o} | ({"api": api} if api else {}) for n, o in specs]}
    return parse_config(data, "test.yaml", plugins={"generic": plugin}).resources


@pytest.fixture
def dev(world: World) -> FakeDev:
    return FakeDev(world.dev_root)


@pytest.fixture
def usb(world: World, dev: FakeDev) -> UsbTree:
    return UsbTree(world.sysfs_root, dev)


@pytest.fixture
def monitor() -> FakeUdevMonitor:
    m = FakeUdevMonitor()
    yield m
    m.close()


def plug_serial(usb: UsbTree, port: str = "1-1", serial: str | None = "FTSN0001", devnum: int = 2, tty: int = 0) -> None:
    usb.plug(
        port,
        *FTDI,
        serial=serial,
        devnum=devnum,
        product_name="FT232R USB UART",
        nodes=[ClassNode("tty", f"ttyUSB{tty}", 188, tty)],
    )


def make_backend(
    world: World, specs: Sequence[tuple[str, dict[str, Any]]], api: str | None = None, **kwargs: Any
) -> GenericBackend:
    return GenericBackend(resources(*specs, api=api), world, **kwargs)


@contextlib.asynccontextmanager
async def running(backend: GenericBackend) -> AsyncIterator[RecordingSink]:
    sink = RecordingSink()
    async with run_backend(backend, sink, timeout=DEADLINE):
        yield sink
