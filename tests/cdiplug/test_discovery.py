"""One-shot discovery (cdiplug.discovery.discover_once), with the real fake backend and small
in-test backends that stop early, fail, stay silent or keep running after their first report."""

from __future__ import annotations

import asyncio

import pytest
from attrs import frozen

from cdiplug.backend import BackendPlugin
from cdiplug.config import load_config, parse_config
from cdiplug.discovery import discover_once
from cdiplug.errors import BackendError
from cdiplug.models.devices import Device, DeviceSnapshot
from cdiplug_backends.fake import plugin as fake_plugin


@frozen
class NoOptions:
    pass


class Scripted:
    """Publishes the resources named in ``publish``, then does ``then``: return, raise, or wait."""

    instances: list[Scripted] = []

    def __init__(self, resources, world, publish=None, then="wait"):
        self.resources = resources
        self.publish = [r.name for r in resources] if publish is None else publish
        self.then = then
        self.cancelled = False
        Scripted.instances.append(self)

    async def run(self, sink) -> None:
        for name in self.publish:
            sink.publish(DeviceSnapshot(name, [Device(f"{name.rpartition('/')[2]}-0")]))
        if self.then == "return":
            return
        if self.then == "raise":
            raise BackendError("sysfs is not there")
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise


def plugins(**kw):
    return {"scripted": BackendPlugin(name="scripted", options_type=NoOptions, create=lambda rs, w: Scripted(rs, w, **kw))}


def config(*resources):
    return {"resources": [{"name": name, "backend": backend} for name, backend in resources]}


async def test_built_in_default(world):
    found = await discover_once(load_config(None), world)
    assert list(found) == ["example.com/fpga"]
    assert found["example.com/fpga"].ids == ("fpga-0", "fpga-1")


async def test_every_resource_in_config_order_and_backends_stopped(world):
    Scripted.instances.clear()
    mixed = {**plugins(), "fake": fake_plugin}
    cfg = parse_config(config(("ab.io/one", "scripted"), ("example.com/fpga", "fake"), ("ab.io/two", "scripted")), "c", mixed)
    found = await discover_once(cfg, world, mixed)
    assert list(found) == ["ab.io/one", "example.com/fpga", "ab.io/two"]
    assert found["ab.io/two"].ids == ("two-0",)
    [backend] = Scripted.instances
    assert backend.cancelled  # created once for both of its resources, stopped afterwards


async def test_backend_that_stops_without_reporting_everything(world):
    p = plugins(publish=["ab.io/one"], then="return")
    cfg = parse_config(config(("ab.io/one", "scripted"), ("ab.io/two", "scripted")), "c", p)
    with pytest.raises(BackendError, match="backend scripted stopped without reporting ab.io/two"):
        await discover_once(cfg, world, p)


async def test_backend_error_is_its_own(world):
    p = plugins(publish=[], then="raise")
    cfg = parse_config(
        config(
            ("ab.io/one", "scripted"),
        ),
        "c",
        p,
    )
    with pytest.raises(BackendError, match="sysfs is not there"):
        await discover_once(cfg, world, p)


async def test_silent_backend_times_out(world):
    p = plugins(publish=[])
    cfg = parse_config(
        config(
            ("ab.io/one", "scripted"),
        ),
        "c",
        p,
    )
    with pytest.raises(BackendError, match=r"backend scripted reported nothing within 0.05 s"):
        await discover_once(cfg, world, p, timeout=0.05)
