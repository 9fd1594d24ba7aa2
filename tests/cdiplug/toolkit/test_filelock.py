"""cdiplug.toolkit.filelock: the one lock-file helper (DRA checkpoint, instance locks, PCI groups).

Covers: a lock held by another open file (as another process would hold it) makes a second taker
wait, then give up after its deadline with an error naming what stayed locked, and succeed once it
is let go; a symlink or a FIFO planted at the lock's path is refused, never followed or opened for
a wait; the lock file and its folder are made private; ``is_held`` tells a held lock from a file
left behind and from no file.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from cdiplug.toolkit import filelock
from cdiplug.toolkit.statefile import StateFileError


def test_a_held_lock_is_waited_for_and_the_wait_is_bounded(tmp_path: Path) -> None:
    path = tmp_path / "state" / "x.lock"
    with filelock.locked(path, "the thing", wait=1):
        assert filelock.is_held(path)
        started = time.monotonic()
        with pytest.raises(filelock.LockBusy, match="the thing stayed locked by another process for 0.2 s"):
            filelock.hold(path, "the thing", wait=0.2)
        assert 0.2 <= time.monotonic() - started < 2
    assert not filelock.is_held(path)  # left behind, held by nobody
    assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o777 == 0o700


def test_a_wait_ends_when_the_holder_lets_go(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    fd = filelock.hold(path, "the thing", wait=0)
    letting_go = threading.Timer(0.1, os.close, (fd,))
    letting_go.start()
    try:
        with filelock.locked(path, "the thing", wait=10):
            pass
    finally:
        letting_go.join()


@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_a_planted_lock_path_is_refused(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "x.lock"
    target = tmp_path / "elsewhere"
    if kind == "symlink":
        target.write_text("")
        path.symlink_to(target)
    else:
        os.mkfifo(path)
    with pytest.raises(StateFileError, match="lock .*x.lock of the thing"):
        filelock.hold(path, "the thing", wait=5)
    assert not filelock.is_held(path)


def test_no_lock_file_is_held_by_nobody(tmp_path: Path) -> None:
    assert not filelock.is_held(tmp_path / "absent.lock")
