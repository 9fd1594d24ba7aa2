"""cdiplug.toolkit.atomic: replacing a file on this machine's real filesystem, and failing safely."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from cdiplug.toolkit.atomic import TEMP_SUFFIX, make_dirs, write_atomic


def test_writes_with_the_mode_asked_for_whatever_the_umask(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    old = os.umask(0o077)
    try:
        st = write_atomic(target, b"new", 0o644)
    finally:
        os.umask(old)
    assert target.read_bytes() == b"new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert st.st_ino == target.stat().st_ino


def test_a_failed_rename_keeps_the_old_file_and_leaves_no_temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "state.json"
    target.write_bytes(b"old")

    def crash(src: object, dst: object) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "rename", crash)
    with pytest.raises(OSError):
        write_atomic(target, b"new", 0o600)
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]
    assert not any(p.name.endswith(TEMP_SUFFIX) for p in tmp_path.iterdir())


def test_a_symlink_planted_at_the_temporary_name_is_not_followed(tmp_path: Path) -> None:
    from cdiplug.toolkit.atomic import temp_name

    target = tmp_path / "spec.json"
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    temp_name(target).symlink_to(victim)
    with pytest.raises(OSError):
        write_atomic(target, b"new", 0o644)
    assert victim.read_bytes() == b"keep"


def test_make_dirs_gives_the_mode_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        make_dirs(tmp_path / "a" / "b", 0o755)
        make_dirs(tmp_path / "a" / "b", 0o700)  # there already: left as it is
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "a" / "b").stat().st_mode) == 0o755
