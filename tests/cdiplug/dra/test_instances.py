"""Which instances run (cdiplug.dra.instances): the lock file each holds from start to stop.

Covers: an instance is alive while its lock is held and gone once released or never started;
a second process (here: a second open file, which flock treats alike) of the same pod UID
cannot take it (an error naming the instance); IDs that are not pod UIDs name no file; the folder and file are private.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cdiplug.dra.instances import InstanceLock
from cdiplug.toolkit.statefile import StateFileError

A = "aaaaaaaa-0000-4000-8000-000000000001"
B = "bbbbbbbb-0000-4000-8000-000000000002"


def test_alive_while_its_lock_is_held(tmp_path: Path) -> None:
    a, b = InstanceLock(tmp_path, A), InstanceLock(tmp_path, B)
    assert not b.alive(A)  # never started
    a.acquire()
    assert b.alive(A) and a.alive(A)
    assert (tmp_path / "dra-instances").stat().st_mode & 0o777 == 0o700
    assert a.path.stat().st_mode & 0o777 == 0o600
    with pytest.raises(StateFileError, match=f"instance lock of {A} stayed locked"):
        InstanceLock(tmp_path, A).acquire()  # the same pod UID twice
    a.release()
    assert not b.alive(A) and not a.path.exists()
    a.path.parent.joinpath(f"{A}.lock").write_text("")  # left behind by a crash: nobody holds it
    assert not b.alive(A)


def test_ids_that_are_no_pod_uid_name_no_file(tmp_path: Path) -> None:
    b = InstanceLock(tmp_path, B)
    assert not b.alive("../../etc/passwd") and not b.alive("")
    with pytest.raises(ValueError):
        InstanceLock(tmp_path, "../x")
