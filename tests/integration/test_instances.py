"""Two cdiplug instances on one node never touch each other's files (real ``cdiplug serve`` processes).

The default instance serves example.com/fpga, instance ``blue`` serves example.com/dongle, both
on one CDI folder, one kubelet folder (the stand-in kubelet over real gRPC) and one state folder.
Each is restarted three times, in turn, while an inotify watch of the test's own (a thread reading
raw inotify events) records every entry removed from those folders for the whole test. No file
of one instance is ever removed while the other restarts, both keep serving (a pod of each is
admitted after every restart), and a third instance configured with a resource the first serves
stops at start with an error naming it. A DRA checkpoint in another instance's state folder is
never read (it would be set aside as unreadable) by these device-plugin-only instances.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import select
import struct
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import attrs
import pytest
import yaml

from cdiplug.models.instance import Instance
from cdiplug.models.names import socket_name
from cdiplug.models.world import World
from cdiplug.testing import KubeletStandIn
from cdiplug.testing.process import DaemonProcess, daemon_process

pytestmark = pytest.mark.slow  # nine daemon processes, about 25 s: the full run has it, --fast leaves it out

FPGA = "example.com/fpga"
DONGLE = "example.com/dongle"
IN_DELETE = 0x200
IN_MOVED_FROM = 0x040
_HEADER = struct.Struct("iIII")
RESTARTS = 3
START_WAIT = 20.0


class Removals:
    """Every entry removed or renamed away from ``folders``, as (time, folder, name), read from raw
    inotify by a thread from start to stop."""

    def __init__(self, folders: list[Path]) -> None:
        self.seen: list[tuple[float, Path, str]] = []
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        assert self._fd >= 0
        self._folders = {}
        for folder in folders:
            wd = self._libc.inotify_add_watch(self._fd, os.fsencode(folder), IN_DELETE | IN_MOVED_FROM)
            assert wd >= 0, folder
            self._folders[wd] = folder
        self._stop_r, self._stop_w = os.pipe()
        self._thread = threading.Thread(target=self._read, name="removals", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        poll = select.poll()
        poll.register(self._fd, select.POLLIN)
        poll.register(self._stop_r, select.POLLIN)
        while True:
            ready = [fd for fd, _ in poll.poll()]
            with contextlib.suppress(BlockingIOError):
                data = os.read(self._fd, 64 * 1024)
                offset = 0
                while offset + _HEADER.size <= len(data):
                    wd, _mask, _cookie, length = _HEADER.unpack_from(data, offset)
                    name = data[offset + _HEADER.size : offset + _HEADER.size + length].split(b"\0", 1)[0]
                    offset += _HEADER.size + length
                    if wd in self._folders and name:
                        self.seen.append((time.monotonic(), self._folders[wd], os.fsdecode(name)))
            if self._stop_r in ready:
                return

    def stop(self) -> None:
        os.write(self._stop_w, b"x")
        self._thread.join(10)
        for fd in (self._fd, self._stop_r, self._stop_w):
            os.close(fd)


@contextlib.contextmanager
def removals(folders: list[Path]) -> Iterator[Removals]:
    watch = Removals(folders)
    try:
        yield watch
    finally:
        watch.stop()


@attrs.define
class Running:
    """One instance's daemon, restarted in place; ``windows`` are its (stop, serving again) times."""

    name: str
    resource: str
    config: Path
    world: World
    process: DaemonProcess | None = None
    windows: list[tuple[float, float]] = attrs.Factory(list)
    _stack: contextlib.AsyncExitStack = attrs.Factory(contextlib.AsyncExitStack)

    @property
    def names(self) -> Instance:
        return Instance(self.name)

    async def start(self, kubelet: KubeletStandIn) -> None:
        before = sum(r.resource == self.resource for r in kubelet.registrations)
        extra = ("--instance", self.name) if self.name else ()
        self.process = await self._stack.enter_async_context(daemon_process(self.world, self.config, *extra))
        await kubelet.wait_until(
            lambda: (
                sum(r.resource == self.resource for r in kubelet.registrations) > before and kubelet.is_registered(self.resource)
            ),
            START_WAIT,
            f"{self.name or 'default'} to register {self.resource} again",
        )

    async def restart(self, kubelet: KubeletStandIn) -> None:
        assert self.process is not None
        began = time.monotonic()
        assert await self.process.stop() == 0
        await self._stack.aclose()
        await self.start(kubelet)
        self.windows.append((began, time.monotonic()))

    async def close(self) -> None:
        if self.process is not None and self.process.proc.returncode is None:
            await self.process.stop()
        await self._stack.aclose()

    def owns(self, folder: Path, name: str) -> bool:
        return self.names.owns_spec(name) or (folder == self.world.kubelet_dir and name == socket_name(self.resource))


def config_file(folder: Path, resource: str) -> Path:
    """``folder/config.yaml`` serving ``resource`` (the daemon's log goes beside it)."""
    folder.mkdir()
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump({"resources": [{"name": resource, "backend": "fake", "options": {"count": 50}}]}))
    return path


@contextlib.asynccontextmanager
async def both(world: World, short_tmp: Path, kubelet: KubeletStandIn) -> AsyncIterator[tuple[Running, Running]]:
    a = Running("", FPGA, config_file(short_tmp / "a", FPGA), world)
    b = Running("blue", DONGLE, config_file(short_tmp / "b", DONGLE), world)
    try:
        await a.start(kubelet)
        await b.start(kubelet)
        yield a, b
    finally:
        await a.close()
        await b.close()


async def test_two_instances_restarting_never_remove_each_others_files(world: World, short_tmp: Path) -> None:
    other_checkpoint = world.state_dir / "instances" / "dra-side" / "dra-claims.json"
    other_checkpoint.parent.mkdir(parents=True)
    other_checkpoint.write_text("not a checkpoint anyone here may read")
    owners = world.state_dir / "owners"
    owners.mkdir()
    pods = 0

    async def both_serve() -> None:
        nonlocal pods
        for resource in (FPGA, DONGLE):
            pods += 1
            assert (await kubelet.admit_pod(f"pod-{pods}", {resource: 1})).admitted, kubelet.describe()

    async with KubeletStandIn(world.kubelet_dir) as kubelet, both(world, short_tmp, kubelet) as (a, b):
        with removals([world.cdi_dir, world.kubelet_dir, owners, world.state_dir]) as watch:
            await both_serve()
            specs = sorted(p.name for p in world.cdi_dir.iterdir())
            assert specs == ["cdiplug-example.com-fpga.json", "cdiplug.blue.example.com-dongle.json"]
            for _ in range(RESTARTS):
                for running in (a, b):
                    await running.restart(kubelet)
                    await both_serve()
            seen = list(watch.seen)
        assert sorted(p.name for p in world.cdi_dir.iterdir()) == specs
        for running in (a, b):
            theirs = [(t, f, n) for t, f, n in seen if running.owns(f, n)]
            outside = [(f, n) for t, f, n in theirs if not any(begin <= t <= end for begin, end in running.windows)]
            assert outside == [], f"files of {running.name or 'the default instance'} removed while it ran"
            assert not [(f, n) for _, f, n in theirs if f == world.cdi_dir]  # its specs: never
        assert not [n for _, f, n in seen if f in (owners, world.state_dir) and not n.startswith(".")]
        # Both served throughout: every pod of either resource was admitted (both_serve asserts it).
        assert pods == 2 * (1 + 2 * RESTARTS)
        assert other_checkpoint.read_text() == "not a checkpoint anyone here may read"
        for running in (a, b):
            assert running.process is not None
            assert running.process.count("checkpoint") == 0

        # A third instance configured with the default instance's resource stops at start, naming it.
        green = config_file(short_tmp / "green", FPGA)
        async with daemon_process(world, green, "--instance", "green") as third:
            assert await asyncio.wait_for(third.proc.wait(), START_WAIT) == 2
            await third.stop()  # the whole log read
        said = third.log.read_text()
        assert "resource example.com/fpga is served on this node by the default instance (no --instance)" in said
        assert "this is instance 'green'" in said
        assert kubelet.is_registered(FPGA) and sorted(p.name for p in world.cdi_dir.iterdir()) == specs
