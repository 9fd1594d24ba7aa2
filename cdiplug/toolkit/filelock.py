"""Lock files: ``fcntl.flock`` on a file of ours, waiting at most a deadline, never through a symlink.

The one way cdiplug holds a lock between processes (the DRA checkpoint's, the instance locks of a
rolling update, the PCI backend's per-group locks):

- the lock file is opened ``O_NOFOLLOW | O_NONBLOCK`` and must be a regular file (a symlink, a
  FIFO or a folder planted at its path is refused, never followed or waited on); made 0600 when
  missing, its folder 0700;
- the wait is bounded: ``flock`` has no timeout of its own and a thread blocked in it cannot be
  given up, so :func:`hold` polls a non-blocking ``flock`` (1 ms, doubling to 50 ms) until
  ``wait`` seconds have passed, then raises :class:`LockBusy` naming what stayed locked;
- the kernel drops the lock when its file descriptor is closed, however the process ends.

Blocking calls: from a thread (``asyncio.to_thread``) in the daemon.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

from cdiplug.toolkit.statefile import FOLDER_MODE, StateFileError

FILE_MODE = 0o600
FIRST_DELAY = 0.001
LAST_DELAY = 0.05


class LockBusy(StateFileError):
    """Another process held the lock past the deadline."""


def hold(path: Path, what: str, *, wait: float, shared: bool = False) -> int:
    """Take the lock on ``path`` (exclusive, or ``shared``); its file descriptor, whose close releases it.

    ``wait`` is how long another process may hold it (0: not at all). StateFileError when the lock
    file cannot be opened or is no regular file, LockBusy when it stayed locked; both name ``what``.
    """
    try:
        path.parent.mkdir(mode=FOLDER_MODE, parents=True, exist_ok=True)  # a --state-dir not made yet
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, FILE_MODE)
    except OSError as exc:
        raise StateFileError(f"cannot open the lock {path} of {what}: {exc.strerror or exc}") from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise StateFileError(f"the lock {path} of {what} is not a regular file")
        _flock(fd, shared, wait, what)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _flock(fd: int, shared: bool, wait: float, what: str) -> None:
    mode = (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB
    deadline = time.monotonic() + wait
    delay = FIRST_DELAY
    while True:
        try:
            fcntl.flock(fd, mode)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise LockBusy(f"{what} stayed locked by another process for {wait:g} s") from None
        time.sleep(min(delay, max(deadline - time.monotonic(), 0)))
        delay = min(delay * 2, LAST_DELAY)


@contextlib.contextmanager
def locked(path: Path, what: str, *, wait: float) -> Iterator[None]:
    """Hold the lock on ``path`` across the block (:func:`hold`)."""
    fd = hold(path, what, wait=wait)
    try:
        yield
    finally:
        os.close(fd)  # releases the lock


def is_held(path: Path) -> bool:
    """Whether a process holds the lock on ``path`` now, shared or exclusive; False when there is no
    such lock file (or it is none of ours)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released by the close below
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False
