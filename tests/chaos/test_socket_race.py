"""The plugin socket raced by a local user: never reachable before it is 0600.

The daemon's socket server (:class:`cdiplug.wire.unixserver.UnixServer`, real grpc on a real unix
socket) starts and stops 50 times under umask 000 in a folder anybody may traverse (0755, and 0777
where anybody may also write), while a child process running as ``nobody`` (``socket_watcher.py``)
watches the folder with inotify and connects to every socket and into every folder that appears.
After each start the test waits until the watcher has handled every event of it, with the socket
live; then: no connection of the watcher's ever succeeded, and the owner (root) connects. A
control runs the way the old code served (bind the temporary name in the folder itself, then chmod)
with the watcher given its turn in between: it connects every time, so the watcher does see a
socket open to it. Needs root (CI runs pytest as root) to run the watcher as another user.
Bound: 2 x 50 re-creations and 5 for the control, ~10 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import stat
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from cdiplug.wire.unixserver import UnixServer

from .conftest import figure

NOBODY = 65534
CYCLES = 50
WATCHER = Path(__file__).with_name("socket_watcher.py")
NAME = "cdiplug-example.com-fpga.sock"


class Watcher:
    """The ``nobody`` process watching ``folder``; ``mark`` waits until it caught up."""

    def __init__(self, proc: asyncio.subprocess.Process, folder: Path) -> None:
        self.proc = proc
        self.folder = folder

    async def line(self) -> str:
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), 20)
        assert line, "the watcher ended early"
        return line.decode().strip()

    async def mark(self, label: str) -> None:
        (self.folder / f"mark-{label}").touch()
        assert await self.line() == f"seen mark-{label}"

    async def done(self) -> dict[str, Any]:
        (self.folder / "done").touch()
        result: dict[str, Any] = json.loads(await self.line())
        return result


@pytest.fixture
def umask_000() -> Iterator[None]:
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def socket_folder(short_tmp: Path, mode: int) -> Path:
    assert os.geteuid() == 0, "this test runs its attacker as nobody: it needs root (CI runs pytest as root)"
    os.chmod(short_tmp, 0o755)
    folder = short_tmp / "device-plugins"
    folder.mkdir()
    os.chmod(folder, mode)
    return folder


@contextlib.asynccontextmanager
async def watching(folder: Path) -> AsyncIterator[Watcher]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(WATCHER), str(folder), str(NOBODY), stdout=asyncio.subprocess.PIPE
    )
    watcher = Watcher(proc, folder)
    try:
        assert await watcher.line() == f"ready {NOBODY} 0000000000000000"  # nobody, without a capability
        yield watcher
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


async def owner_connects(path: Path) -> None:
    async with grpc.aio.insecure_channel(f"unix://{path}") as channel:
        await asyncio.wait_for(channel.channel_ready(), 10)


@pytest.mark.parametrize("folder_mode", [0o755, 0o777], ids=["0755", "0777"])
async def test_no_connection_before_the_socket_is_0600(short_tmp: Path, umask_000: None, folder_mode: int) -> None:
    folder = socket_folder(short_tmp, folder_mode)
    path = folder / NAME
    async with watching(folder) as watcher:
        for i in range(CYCLES):
            server = UnixServer(path, lambda _server: None)
            await server.start()
            assert stat.S_IMODE(path.lstat().st_mode) == 0o600
            await watcher.mark(str(i))  # it has tried every name of this start, the socket serving
            await owner_connects(path)
            assert [n for n in os.listdir(folder) if not n.startswith("mark-")] == [NAME]  # no private folder left
            await server.stop(None)
        result = await watcher.done()
    figure(f"socket race, folder {folder_mode:o}: nobody's connections in {CYCLES} re-creations", result["connections"])
    assert result["connections"] == 0, result["paths"]
    assert result["attempts"] >= 2 * CYCLES  # the private folder and the socket renamed into place, each time


async def test_control_the_old_way_is_reachable(short_tmp: Path, umask_000: None) -> None:
    folder = socket_folder(short_tmp, 0o755)
    path = folder / NAME
    rounds = 5
    async with watching(folder) as watcher:
        for i in range(rounds):
            temp = folder / f".cdiplug-{os.getpid()}-{i}.sock"
            server = grpc.aio.server()
            assert server.add_insecure_port(f"unix://{temp}") != 0
            await watcher.mark(str(i))  # the old code's window, held open until the watcher had its turn
            os.chmod(temp, 0o600)
            os.rename(temp, path)
            await server.start()
            await server.stop(None)
            path.unlink(missing_ok=True)
        result = await watcher.done()
    assert result["connections"] == rounds, result
