"""cdiplug.toolkit.statefile: state files written whole (0600, folder 0700), read bounded, set aside when unusable.

Covers: write makes the folder 0700 and the file 0600 whatever the umask and leaves no temporary
file; load gives the default for a missing file and for a corrupt one, which is renamed to
``<name>.corrupt-<time>`` (a second one in the same second gets its own name) with the reason
logged; a file over the limit, a symlink (renamed, its target untouched) and a FIFO (never opened
for a read that would hang) count as corrupt.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from cdiplug.toolkit import statefile


def parse(data: bytes) -> dict[str, int]:
    value = json.loads(data)
    if not isinstance(value, dict):
        raise ValueError("not an object")
    return value


def test_write_is_whole_and_narrow(tmp_path: Path) -> None:
    path = tmp_path / "state" / "x.json"
    old = os.umask(0)
    try:
        statefile.write(path, b'{"a": 1}', "test state")
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o777 == 0o700
    assert statefile.load(path, 100, "test state", parse, dict) == {"a": 1}
    assert os.listdir(path.parent) == ["x.json"]


def test_missing_is_the_default(tmp_path: Path) -> None:
    assert statefile.load(tmp_path / "none.json", 100, "test state", parse, lambda: {"default": 1}) == {"default": 1}


@pytest.mark.parametrize(("content", "reason"), [(b"[1]", "not an object"), (b"{" * 3, "Expecting"), (b"1" * 200, "too big")])
def test_corrupt_files_are_set_aside(tmp_path: Path, content: bytes, reason: str, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "x.json"
    for _ in range(2):  # twice in the same second: two names
        path.write_bytes(content)
        with caplog.at_level(logging.ERROR):
            assert statefile.load(path, 100, "test state", parse, dict) == {}
    aside = sorted(p.name for p in tmp_path.iterdir())
    assert len(aside) == 2 and all(n.startswith("x.json.corrupt-") for n in aside) and not path.exists()
    assert reason in caplog.text and aside[0] in caplog.text


def test_symlinks_and_fifos_are_never_followed(tmp_path: Path) -> None:
    target = tmp_path / "target.json"
    target.write_text('{"a": 1}')
    link = tmp_path / "link.json"
    link.symlink_to(target)
    assert statefile.load(link, 100, "test state", parse, dict) == {}
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    assert statefile.load(fifo, 100, "test state", parse, dict) == {}  # returns: no open that blocks
    names = sorted(p.name for p in tmp_path.iterdir())
    assert target.read_text() == '{"a": 1}' and [n.split(".corrupt-")[0] for n in names if ".corrupt-" in n] == [
        "fifo.json",
        "link.json",
    ]
