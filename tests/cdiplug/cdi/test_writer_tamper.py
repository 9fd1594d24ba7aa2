"""The spec writer against tampering, on a real filesystem: an edit that keeps
size and mtime (ctime gives it away), a symlink to a perfect copy, a folder, a FIFO, a socket at
our path (moved aside as ``<name>.moved-aside-<n>`` and reported, never followed or read, never
accepted by ``is_current``), a file where the CDI folder should be, and folders created 0755
whatever the umask."""

from __future__ import annotations

import os
import socket
import stat
import time
from pathlib import Path

import pytest

from cdiplug.cdi.writer import SpecWriter
from cdiplug.models.devices import DeviceSnapshot

KIND = "example.com/fpga"


def test_an_edit_that_keeps_size_and_mtime_is_noticed(tmp_path: Path, fpga_snapshot: DeviceSnapshot) -> None:
    writer = SpecWriter(tmp_path)
    writer.write(KIND, fpga_snapshot)
    path = writer.path_for(KIND)
    good = path.read_bytes()
    st = path.stat()
    time.sleep(0.02)  # ctime has a clock granularity: make sure the edit lands on a later tick
    path.write_bytes(good.replace(b"fpga", b"FPGA", 1))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # size and mtime as we left them
    assert not writer.is_current(KIND, fpga_snapshot)
    assert writer.write(KIND, fpga_snapshot) is True and path.read_bytes() == good


@pytest.mark.parametrize("obstacle", ["symlink-to-a-copy", "dangling-symlink", "folder", "fifo", "socket"])
def test_what_is_no_regular_file_is_moved_aside(tmp_path: Path, fpga_snapshot: DeviceSnapshot, obstacle: str, caplog) -> None:
    writer = SpecWriter(tmp_path / "cdi")
    writer.write(KIND, fpga_snapshot)
    path = writer.path_for(KIND)
    good = path.read_bytes()
    path.unlink()
    copy = tmp_path / "copy.json"
    copy.write_bytes(good)
    sock = None
    if obstacle == "symlink-to-a-copy":
        path.symlink_to(copy)
    elif obstacle == "dangling-symlink":
        path.symlink_to(tmp_path / "nowhere")
    elif obstacle == "folder":
        path.mkdir()
        (path / "inside").write_text("kept")
    elif obstacle == "fifo":
        os.mkfifo(path, 0o644)
    else:
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
    try:
        assert not writer.is_current(KIND, fpga_snapshot)
        fresh = SpecWriter(tmp_path / "cdi")  # a restarted daemon: nothing remembered, nothing read through
        for w in (fresh, writer):
            assert w.write(KIND, fpga_snapshot) is True or w is writer
        st = path.lstat()
        assert stat.S_ISREG(st.st_mode) and path.read_bytes() == good
        aside = path.with_name(path.name + ".moved-aside-1")
        assert os.path.lexists(aside) and "moved aside to " + aside.name in caplog.text
        assert copy.read_bytes() == good  # what a symlink pointed at is never touched
        if obstacle == "folder":
            assert (aside / "inside").read_text() == "kept"
        assert writer.is_current(KIND, fpga_snapshot)
    finally:
        if sock is not None:
            sock.close()


def test_a_file_where_the_folder_belongs_is_moved_aside(tmp_path: Path, fpga_snapshot: DeviceSnapshot) -> None:
    cdi = tmp_path / "cdi"
    cdi.write_text("not a folder")
    writer = SpecWriter(cdi)
    assert writer.write(KIND, fpga_snapshot) is True
    assert cdi.is_dir() and (tmp_path / "cdi.moved-aside-1").read_text() == "not a folder"


def test_folders_are_created_0755_whatever_the_umask(tmp_path: Path, fpga_snapshot: DeviceSnapshot) -> None:
    old = os.umask(0o077)
    try:
        writer = SpecWriter(tmp_path / "run" / "cdi")
        writer.write(KIND, fpga_snapshot)
    finally:
        os.umask(old)
    for folder in (tmp_path / "run", tmp_path / "run" / "cdi"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o755
    assert stat.S_IMODE(writer.path_for(KIND).stat().st_mode) == 0o644
