"""Watching a folder for files appearing, changing and going away, through Linux inotify.

Used for the kubelet folder (kubelet.sock re-created, our socket removed: a kubelet restart) and
for files backends re-read on change (the fake backend's health file). Events arrive on the event
loop through ``add_reader``; nothing polls. When the folder itself goes away, the watch reports
:data:`FOLDER` and re-arms itself once the folder is back. With ``gone_first`` (for a consumer
that re-creates the folder itself: the CDI spec keepers), the :data:`FOLDER` batch comes at once,
while the folder is still gone, and a second one once the watch is armed again.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import os
import struct
from collections.abc import AsyncIterator
from pathlib import Path

from cdiplug.errors import CdiplugError

IN_MODIFY = 0x002
IN_ATTRIB = 0x004
IN_CLOSE_WRITE = 0x008
IN_MOVED_FROM = 0x040
IN_MOVED_TO = 0x080
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_IGNORED = 0x8000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC

_MASK = (
    IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_DELETE_SELF | IN_MOVE_SELF
)
_HEADER = struct.Struct("iIII")
FOLDER = "."  # reported when the watched folder itself was removed or moved


def _load_libc() -> ctypes.CDLL:
    """The C library: the process's own symbols (Python links it), else found by name.

    ``ctypes.util.find_library`` runs ``ldconfig -p`` (a subprocess) to find it: only when the
    process's own symbols lack inotify (a static Python, say).
    """
    libc = ctypes.CDLL(None, use_errno=True)
    if hasattr(libc, "inotify_init1"):
        return libc
    from ctypes.util import find_library

    return ctypes.CDLL(find_library("c") or "libc.so.6", use_errno=True)


_libc = _load_libc()


class WatchError(CdiplugError):
    """inotify could not be set up."""


class FolderWatch:
    """Reports the names of entries in ``folder`` that changed, in batches.

    Use as ``async with FolderWatch(path) as w: async for names in w: ...``. Batches coalesce
    whatever arrived while the consumer was busy, which debounces bursts for free.
    """

    def __init__(self, folder: Path, rearm_interval: float = 0.05, *, gone_first: bool = False) -> None:
        self.folder = Path(folder)
        self._rearm_interval = rearm_interval
        self._gone_first = gone_first
        self._fd = -1
        self._wd = -1
        self._pending: set[str] = set()
        self._event = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    async def __aenter__(self) -> FolderWatch:
        self._loop = asyncio.get_running_loop()
        fd = _libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise WatchError(f"inotify_init1 failed: {os.strerror(err)}")
        self._fd = fd
        if not self._arm():
            self._pending.add(FOLDER)  # not there yet: the first batch waits for it
            self._event.set()
        self._loop.add_reader(fd, self._on_readable)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._fd >= 0:
            if self._loop is not None:
                self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1

    def _arm(self) -> bool:
        wd = _libc.inotify_add_watch(self._fd, os.fsencode(self.folder), _MASK)
        if wd < 0:
            err = ctypes.get_errno()
            if err == errno.ENOENT:
                self._wd = -1
                return False
            raise WatchError(f"cannot watch {self.folder}: {os.strerror(err)}")
        self._wd = wd
        return True

    def _on_readable(self) -> None:
        try:
            data = os.read(self._fd, 64 * 1024)
        except BlockingIOError:
            return
        offset = 0
        while offset + _HEADER.size <= len(data):
            wd, mask, _cookie, length = _HEADER.unpack_from(data, offset)
            name = data[offset + _HEADER.size : offset + _HEADER.size + length].split(b"\0", 1)[0]
            offset += _HEADER.size + length
            if wd != self._wd and self._wd >= 0:
                continue  # the late end of a watch on a folder that was replaced since
            if mask & (IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED):
                self._wd = -1
                self._pending.add(FOLDER)
            elif name:
                self._pending.add(os.fsdecode(name))
        if self._pending:
            self._event.set()

    async def _rearm_when_back(self) -> None:
        while self._fd >= 0 and not self._arm():
            await asyncio.sleep(self._rearm_interval)  # the folder is gone: nothing to wait on but time

    def __aiter__(self) -> AsyncIterator[set[str]]:
        return self._batches()

    async def _batches(self) -> AsyncIterator[set[str]]:
        while self._fd >= 0:
            await self._event.wait()
            self._event.clear()
            batch, self._pending = self._pending, set()
            if FOLDER in batch and self._wd < 0:
                if self._gone_first:
                    yield batch  # the consumer may re-create the folder now
                    while self._fd >= 0 and not self._arm():  # gone again, or not re-created
                        await asyncio.sleep(self._rearm_interval)  # nothing to wait on but time
                        yield {FOLDER}
                    batch = {FOLDER}  # what changed before the watch was armed again: look again
                else:
                    await self._rearm_when_back()
            yield batch
