"""The spec writer (``cdiplug.cdi.writer``) against a real filesystem in a temporary folder:
atomic replacement, mode 0644, unchanged content left alone (one ``os.stat`` on the hot path),
files changed behind its back rewritten, failures (a read-only folder — a real read-only tmpfs
mount when run as root — and a failing rename, standing in for a crash between write and rename)
leaving the old file intact and no temporary files, and stale-file removal that touches nothing
but cdiplug's own specs. Every file written is checked against the official schema."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from cdiplug.cdi.validate import check_file
from cdiplug.cdi.writer import SpecWriter
from cdiplug.errors import CdiError
from cdiplug.models.devices import ContainerEdits, Device, DeviceSnapshot
from cdiplug.models.instance import Instance

KIND = "example.com/fpga"


def files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def more_devices(snapshot: DeviceSnapshot) -> DeviceSnapshot:
    extra = Device(id="fpga-9", edits=ContainerEdits(env={"FPGA_9": "fpga-9"}))
    return snapshot.with_devices([*snapshot.devices, extra])


def test_write_creates_a_valid_0644_file(tmp_path: Path, fpga_snapshot: DeviceSnapshot, schema_errors) -> None:
    writer = SpecWriter(tmp_path / "cdi")  # created on first write
    old_umask = os.umask(0o077)
    try:
        assert writer.write(KIND, fpga_snapshot) is True
    finally:
        os.umask(old_umask)
    path = writer.path_for(KIND)
    assert path == tmp_path / "cdi" / "cdiplug-example.com-fpga.json"
    assert path.stat().st_mode & 0o7777 == 0o644
    assert path.read_bytes() == writer.render(KIND, fpga_snapshot)
    assert schema_errors(json.loads(path.read_text())) == []
    assert check_file(path) == []
    assert files(path.parent) == [path.name]


def test_unchanged_content_is_not_rewritten(tmp_path: Path, fpga_snapshot: DeviceSnapshot) -> None:
    writer = SpecWriter(tmp_path)
    writer.write(KIND, fpga_snapshot)
    before = writer.path_for(KIND).stat()
    assert writer.write(KIND, fpga_snapshot) is False
    # an equal snapshot that is another object, and a fresh writer (a daemon restart): same
    assert writer.write(KIND, attrs.evolve(fpga_snapshot)) is False
    assert SpecWriter(tmp_path).write(KIND, fpga_snapshot) is False
    after = writer.path_for(KIND).stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_hot_path_costs_one_stat(tmp_path: Path, fpga_snapshot: DeviceSnapshot, monkeypatch: pytest.MonkeyPatch) -> None:
    writer = SpecWriter(tmp_path)
    writer.write(KIND, fpga_snapshot)
    calls: list[str] = []
    real_stat, real_open = os.stat, os.open
    monkeypatch.setattr(os, "stat", lambda *a, **k: calls.append("stat") or real_stat(*a, **k))
    monkeypatch.setattr(os, "open", lambda *a, **k: calls.append("open") or real_open(*a, **k))
    for _ in range(3):
        assert writer.write(KIND, fpga_snapshot) is False
    assert calls == ["stat"] * 3


def test_changes_are_written(tmp_path: Path, fpga_snapshot: DeviceSnapshot) -> None:
    writer = SpecWriter(tmp_path)
    writer.write(KIND, fpga_snapshot)
    bigger = more_devices(fpga_snapshot)
    assert writer.write(KIND, bigger) is True
    names = [d["name"] for d in json.loads(writer.path_for(KIND).read_text())["devices"]]
    assert names == ["fpga-0", "fpga-1", "fpga-2", "fpga-9"]
    # an edit of one device's container edits is a change too
    edited = bigger.with_devices(
        [attrs.evolve(d, edits=ContainerEdits(env={"X": "1"})) if d.id == "fpga-0" else d for d in bigger.devices]
    )
    assert writer.write(KIND, edited) is True
    assert "X=1" in writer.path_for(KIND).read_text()
    assert files(tmp_path) == ["cdiplug-example.com-fpga.json"]


def test_health_alone_does_not_rewrite(tmp_path: Path, fpga_snapshot: DeviceSnapshot) -> None:
    from cdiplug.models.devices import Health

    writer = SpecWriter(tmp_path)
    writer.write(KIND, fpga_snapshot)
    sick = fpga_snapshot.with_devices([attrs.evolve(d, health=Health.UNHEALTHY) for d in fpga_snapshot.devices])
    assert writer.write(KIND, sick) is False


@pytest.mark.parametrize("meddle", ["remove", "edit", "replace", "chmod"])
def test_changed_behind_our_back_is_rewritten(tmp_path: Path, fpga_snapshot: DeviceSnapshot, meddle: str) -> None:
    writer = SpecWriter(tmp_path)
    writer.write(KIND, fpga_snapshot)
    path = writer.path_for(KIND)
    good = path.read_bytes()
    if meddle == "remove":
        path.unlink()
    elif meddle == "edit":
        with path.open("r+b") as f:
            f.write(b"[")
    elif meddle == "replace":
        other = tmp_path / "other"
        other.write_bytes(good)
        os.rename(other, path)
    else:
        path.chmod(0o600)
    assert writer.write(KIND, fpga_snapshot) is True
    assert path.read_bytes() == good and path.stat().st_mode & 0o7777 == 0o644


def test_no_devices_removes_the_file(tmp_path: Path, fpga_snapshot: DeviceSnapshot) -> None:
    writer = SpecWriter(tmp_path)
    writer.write(KIND, fpga_snapshot)
    assert writer.write(KIND, fpga_snapshot.with_devices([])) is True
    assert files(tmp_path) == []
    assert writer.write(KIND, fpga_snapshot.with_devices([])) is False
    assert writer.write(KIND, fpga_snapshot) is True


def test_a_device_without_edits_fails_and_keeps_the_old_file(tmp_path: Path, fpga_snapshot: DeviceSnapshot) -> None:
    writer = SpecWriter(tmp_path)
    writer.write(KIND, fpga_snapshot)
    good = writer.path_for(KIND).read_bytes()
    broken = fpga_snapshot.with_devices([*fpga_snapshot.devices, Device(id="bare")])
    with pytest.raises(CdiError, match="'bare'"):
        writer.write(KIND, broken)
    assert writer.path_for(KIND).read_bytes() == good


@pytest.fixture
def read_only_folder(tmp_path: Path) -> Iterator[Path]:
    """A folder whose writes fail: a tmpfs remounted read-only as root (root ignores mode bits),
    mode 0555 otherwise. Yields it writable; call ``lock()`` on the result's ``.lock`` attribute."""
    folder = tmp_path / "ro"
    folder.mkdir()
    mounted = False
    if os.geteuid() == 0:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0755", "cdiplug-test", str(folder)], check=True)
        mounted = True
    try:
        yield folder
    finally:
        if mounted:
            subprocess.run(["umount", str(folder)], check=True)
        else:
            folder.chmod(0o755)


def make_read_only(folder: Path) -> None:
    if os.geteuid() == 0:
        subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)
    else:
        folder.chmod(0o555)


def test_read_only_folder(read_only_folder: Path, fpga_snapshot: DeviceSnapshot) -> None:
    writer = SpecWriter(read_only_folder)
    writer.write(KIND, fpga_snapshot)
    good = writer.path_for(KIND).read_bytes()
    make_read_only(read_only_folder)
    with pytest.raises(CdiError, match=r"cannot write CDI spec .*cdiplug-example.com-fpga.json"):
        writer.write(KIND, more_devices(fpga_snapshot))
    assert writer.path_for(KIND).read_bytes() == good
    assert files(read_only_folder) == ["cdiplug-example.com-fpga.json"]


def test_crash_between_write_and_rename(tmp_path: Path, fpga_snapshot: DeviceSnapshot, monkeypatch: pytest.MonkeyPatch) -> None:
    writer = SpecWriter(tmp_path)
    writer.write(KIND, fpga_snapshot)
    good = writer.path_for(KIND).read_bytes()
    seen: list[str] = []

    def failing_rename(src: str, dst: str) -> None:
        seen.append(Path(src).name)
        assert Path(src).exists() and Path(src).parent == tmp_path  # written beside the target
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "rename", failing_rename)
    with pytest.raises(CdiError, match="Input/output error"):
        writer.write(KIND, more_devices(fpga_snapshot))
    assert seen and not seen[0].endswith(".json")  # a name runtimes ignore
    assert writer.path_for(KIND).read_bytes() == good
    assert files(tmp_path) == ["cdiplug-example.com-fpga.json"]
    monkeypatch.undo()
    assert writer.write(KIND, more_devices(fpga_snapshot)) is True  # nothing poisoned


def test_temp_file_left_by_a_real_crash_is_cleaned_up(tmp_path: Path, fpga_snapshot: DeviceSnapshot) -> None:
    leftover = tmp_path / ".cdiplug-example.com-fpga.json.4242.1.tmp"
    leftover.write_text("{")
    writer = SpecWriter(tmp_path)
    writer.write(KIND, fpga_snapshot)
    assert writer.remove_stale([KIND]) == [leftover]
    assert files(tmp_path) == ["cdiplug-example.com-fpga.json"]


def test_remove_stale_touches_only_our_stale_files(tmp_path: Path, fpga_snapshot: DeviceSnapshot) -> None:
    writer = SpecWriter(tmp_path)
    writer.write(KIND, fpga_snapshot)
    writer.write("example.com/old", fpga_snapshot)
    (tmp_path / "nvidia.com-gpu.json").write_text("{}")  # someone else's
    (tmp_path / "cdiplug-example.com-other.yaml").write_text("{}")  # not a name we write
    (tmp_path / "cdiplugish.json").write_text("{}")
    (tmp_path / "cdiplug-dir.json").mkdir()
    target = tmp_path / "precious"
    target.write_text("keep me")
    (tmp_path / "cdiplug-link.json").symlink_to(target)
    removed = writer.remove_stale([KIND])
    assert removed == [tmp_path / "cdiplug-example.com-old.json"]
    assert files(tmp_path) == sorted(
        [
            "cdiplug-example.com-fpga.json",
            "nvidia.com-gpu.json",
            "cdiplug-example.com-other.yaml",
            "cdiplugish.json",
            "cdiplug-dir.json",
            "precious",
            "cdiplug-link.json",
        ]
    )
    assert target.read_text() == "keep me"
    assert writer.remove_stale([KIND]) == []
    assert SpecWriter(tmp_path / "missing").remove_stale([]) == []
    # the writer forgot the removed kind: writing it again recreates the file
    assert writer.write("example.com/old", fpga_snapshot) is True


def test_concurrent_writes(tmp_path: Path, fpga_snapshot: DeviceSnapshot) -> None:
    writer = SpecWriter(tmp_path)
    snapshots = [fpga_snapshot, more_devices(fpga_snapshot)]
    errors: list[BaseException] = []

    def hammer(i: int) -> None:
        try:
            for j in range(20):
                writer.write(KIND, snapshots[(i + j) % 2])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=hammer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert files(tmp_path) == ["cdiplug-example.com-fpga.json"]
    assert check_file(writer.path_for(KIND)) == []


def test_kind_cannot_leave_the_folder(tmp_path: Path, fpga_snapshot: DeviceSnapshot) -> None:
    writer = SpecWriter(tmp_path / "cdi")
    for kind in ("../x/y", "a/../../b", "/etc/passwd"):
        with pytest.raises(CdiError):
            writer.write(kind, fpga_snapshot)
    assert files(tmp_path) == []


def test_another_instances_spec_of_a_kind_we_serve_now_goes_the_others_stay(
    tmp_path: Path, fpga_snapshot: DeviceSnapshot
) -> None:
    # Two specs of one kind in one folder make every device of it unresolvable for the runtime
    # ("unresolvable CDI devices example.com/fpga=fpga-0"). The instance that holds the resource's
    # claim takes the kind over; another instance's specs of other kinds stay.
    SpecWriter(tmp_path).write(KIND, fpga_snapshot)  # the default instance, stopped
    SpecWriter(tmp_path, names=Instance("old")).write(KIND, fpga_snapshot)  # a named one, stopped
    SpecWriter(tmp_path, names=Instance("blue")).write("example.com/dongle", fpga_snapshot)  # serving another kind
    seed = SpecWriter(tmp_path, names=Instance("seed"))
    seed.write(KIND, fpga_snapshot)
    removed = seed.remove_stale([KIND])
    assert removed == sorted([tmp_path / "cdiplug-example.com-fpga.json", tmp_path / "cdiplug.old.example.com-fpga.json"])
    assert files(tmp_path) == ["cdiplug.blue.example.com-dongle.json", "cdiplug.seed.example.com-fpga.json"]
    # and the default instance takes it back the same way
    default = SpecWriter(tmp_path)
    default.write(KIND, fpga_snapshot)
    assert default.remove_stale([KIND]) == [tmp_path / "cdiplug.seed.example.com-fpga.json"]
