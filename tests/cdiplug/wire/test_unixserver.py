"""How :class:`cdiplug.wire.unixserver.UnixServer` makes its socket: bound inside a private
0700 folder beside the target, 0600 before it is renamed into place, the folder removed after;
nothing left behind when binding fails; private folders a crash left are removed at the next
start, only those of this socket's name, that are folders and are ours. Real grpc on unix sockets
in tmp folders, under umask 000. The race against a user watching the folder: tests/chaos.
"""

from __future__ import annotations

import hashlib
import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from cdiplug.errors import SocketInUse
from cdiplug.wire.unixserver import UnixServer

NAME = "cdiplug-example.com-fpga.sock"


def prefix(name: str) -> str:
    """The documented name of the private folders: ``.cdiplug-<hash of the name>-<random>``."""
    return f".cdiplug-{hashlib.sha256(name.encode()).hexdigest()[:8]}-"


@pytest.fixture(autouse=True)
def umask_000() -> Iterator[None]:
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


async def test_the_socket_is_bound_in_a_private_folder_and_0600_before_it_is_in_place(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = short_tmp / NAME
    seen = []
    rename = os.rename

    def spying_rename(src: str | Path, dst: str | Path) -> None:
        src = Path(src)
        seen.append((src, stat.S_IMODE(src.parent.stat().st_mode), stat.S_IMODE(src.lstat().st_mode), src.parent.stat().st_uid))
        rename(src, dst)

    monkeypatch.setattr(os, "rename", spying_rename)
    server = UnixServer(path, lambda _server: None)
    await server.start()
    try:
        [(src, folder_mode, socket_mode, owner)] = seen
        assert src.parent.parent == short_tmp and src.parent.name.startswith(prefix(NAME))
        assert (folder_mode, socket_mode, owner) == (0o700, 0o600, os.geteuid())
        assert len(str(src)) <= len(str(short_tmp)) + 1 + 30  # what config.py allows for it
        assert os.listdir(short_tmp) == [NAME] and stat.S_IMODE(path.lstat().st_mode) == 0o600
    finally:
        await server.stop()
    assert os.listdir(short_tmp) == []


async def test_a_failed_start_leaves_nothing_behind(short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = short_tmp / NAME

    def failing_rename(src: str | Path, dst: str | Path) -> None:
        raise OSError(5, "Input/output error")

    with monkeypatch.context() as patched:
        patched.setattr(os, "rename", failing_rename)  # bound and 0600 in its folder, then a failure
        with pytest.raises(SocketInUse, match=f"cannot serve on {path}: Input/output error"):
            await UnixServer(path, lambda _server: None).start()
    assert os.listdir(short_tmp) == []
    # A folder short enough for the socket's own path but not for the private folder's.
    long = short_tmp / ("d" * (90 - len(str(short_tmp)))) / "x.sock"
    with pytest.raises(SocketInUse, match="too long for cdiplug's temporary socket path"):
        await UnixServer(long, lambda _server: None).start()
    assert os.listdir(long.parent) == []


async def test_leftovers_of_a_crash_are_removed_only_if_ours(short_tmp: Path) -> None:
    path = short_tmp / NAME
    ours = short_tmp / (prefix(NAME) + "abcd_123")
    ours.mkdir(mode=0o700)
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(ours / "s"))  # bound, nobody listening: what a crash leaves
    stale.close()
    empty = short_tmp / (prefix(NAME) + "zzzzzzzz")
    empty.mkdir()
    not_a_folder = short_tmp / (prefix(NAME) + "file0000")
    not_a_folder.write_text("x")
    someone_elses = short_tmp / (prefix(NAME) + "nobody00")
    someone_elses.mkdir()
    os.chown(someone_elses, 65534, 65534)
    other_name = short_tmp / (prefix("dra.sock") + "abcd_123")
    other_name.mkdir()
    server = UnixServer(path, lambda _server: None)
    await server.start()
    await server.stop()
    assert sorted(os.listdir(short_tmp)) == sorted(p.name for p in (not_a_folder, someone_elses, other_name))
