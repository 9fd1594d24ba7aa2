"""cdiplug.testing.sink: the recording sink and ``running``, with small backends written here."""

from __future__ import annotations

import asyncio

import pytest

from cdiplug.errors import BackendError
from cdiplug.models.devices import Device, DeviceSnapshot, Health
from cdiplug.testing.sink import RecordingSink, running


class Scripted:
    def __init__(self, names: list[str], fail: bool = False, publish: bool = True) -> None:
        self.names, self.fail, self.do_publish = names, fail, publish
        self.flip = asyncio.Event()

    async def run(self, sink: RecordingSink) -> None:
        if self.fail:
            raise BackendError("sysfs is unreadable")
        if not self.do_publish:
            return
        for name in self.names:
            sink.publish(DeviceSnapshot(name, [Device("d0")]))
        await self.flip.wait()
        sink.publish(DeviceSnapshot(self.names[0], [Device("d0", health=Health.UNHEALTHY)]))
        await asyncio.Event().wait()


async def test_running_enters_once_every_resource_published_and_sink_awaits_changes() -> None:
    backend, sink = Scripted(["example.com/a", "example.com/b"]), RecordingSink()
    async with running(backend, sink, backend.names) as task:
        assert set(sink.latest) == {"example.com/a", "example.com/b"}
        backend.flip.set()
        snap = await sink.until("example.com/a", lambda s: not s.get("d0").healthy)
        assert sink.health("example.com/a") == {"d0": "Unhealthy"}
        assert sink.history[-1] is snap and len(sink.history) == 3
    assert task.cancelled()


async def test_running_reraises_the_backends_own_error() -> None:
    with pytest.raises(BackendError, match="sysfs is unreadable"):
        async with running(Scripted(["example.com/a"], fail=True), RecordingSink(), ["example.com/a"]):
            pass


async def test_running_says_which_resource_never_published() -> None:
    with pytest.raises(AssertionError, match="example.com/a"):
        async with running(Scripted(["example.com/a"], publish=False), RecordingSink(), ["example.com/a"]):
            pass


async def test_until_times_out() -> None:
    with pytest.raises(TimeoutError):
        await RecordingSink().until("example.com/a", timeout=0.05)
