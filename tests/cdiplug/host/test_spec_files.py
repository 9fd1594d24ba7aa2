"""Spec files rendered by their owner (DRA claims' specs) kept by the one owner of the CDI folder.

SpecKeepers.keep_file writes a file of given bytes and the real folder watch (inotify) writes it
again when it is deleted or changed, while the owner's guard wants it; drop_file removes it and
the watch lets it be. Names are per instance: no sweep, repair or removal of one instance ever
touches another's files. Each wait is on an inotify watch of the test's own, with a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cdiplug.errors import CdiError
from cdiplug.host import SpecKeepers
from cdiplug.models.devices import ContainerEdits, Device, DeviceSnapshot
from cdiplug.models.instance import Instance
from cdiplug.toolkit.filewatch import FolderWatch

DEADLINE = 5.0
CONTENT = b'{"cdiVersion": "0.5.0", "kind": "k8s.fpga.example.com/claim", "devices": []}\n'


@contextlib.asynccontextmanager
async def watching(keepers: SpecKeepers) -> AsyncIterator[None]:
    task = asyncio.create_task(keepers.watch(), name="spec watch under test")
    try:
        await asyncio.wait_for(keepers.armed.wait(), DEADLINE)
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def until(folder: Path, check: object) -> float:
    """Seconds until ``check()`` holds, woken by inotify events on ``folder``."""
    assert callable(check)
    started = time.monotonic()
    async with asyncio.timeout(DEADLINE):
        while not check():
            async with FolderWatch(folder) as events:
                if not check():
                    await anext(aiter(events))
    return time.monotonic() - started


def holds(path: Path, content: bytes) -> bool:
    try:
        return path.read_bytes() == content
    except OSError:
        return False


async def test_a_deleted_or_edited_kept_file_is_back_within_a_second(tmp_path: Path) -> None:
    keepers = SpecKeepers(tmp_path / "cdi")
    name = Instance().claim_spec("uid-1")
    async with watching(keepers):
        assert await keepers.keep_file(name, CONTENT) is True
        assert await keepers.keep_file(name, CONTENT) is False  # as written: nothing to do
        path = keepers.cdi_dir / name
        for tamper in (Path.unlink, lambda p: p.write_bytes(b"{")):
            tamper(path)
            assert await until(keepers.cdi_dir, lambda: holds(path, CONTENT)) < 1.0
        assert path.stat().st_mode & 0o777 == 0o644


async def test_a_dropped_file_stays_gone_and_the_guard_is_asked(tmp_path: Path) -> None:
    keepers = SpecKeepers(tmp_path / "cdi")
    wanted = {"a": True, "b": False}
    asked: list[str] = []
    b_asked = asyncio.Event()

    async def guard(name: str) -> bool:
        asked.append(name)
        if name == b:
            b_asked.set()
        return wanted[name.removeprefix("cdiplug-claim-").removesuffix(".json")]

    keepers.guard_files(guard)
    a, b, c = (Instance().claim_spec(u) for u in ("a", "b", "c"))
    async with watching(keepers):
        for name in (a, b, c):
            await keepers.keep_file(name, CONTENT)
        assert await keepers.drop_file(c) is True and await keepers.drop_file(c) is False
        (keepers.cdi_dir / b).unlink()  # its owner (another pod, say) removed it: not wanted
        (keepers.cdi_dir / a).unlink()
        await until(keepers.cdi_dir, lambda: holds(keepers.cdi_dir / a, CONTENT))
        await asyncio.wait_for(b_asked.wait(), DEADLINE)  # its owner was asked, and said no
        assert not (keepers.cdi_dir / b).exists() and not (keepers.cdi_dir / c).exists()
        await keepers.keep_file(a, CONTENT)  # one more event round trip: c is still gone
        assert not (keepers.cdi_dir / c).exists()  # dropped: nobody keeps it


async def test_a_file_left_by_an_earlier_run_is_adopted_and_kept(tmp_path: Path) -> None:
    folder = tmp_path / "cdi"
    folder.mkdir()
    name = Instance("blue").claim_spec("uid-2")
    (folder / name).write_bytes(CONTENT)
    (folder / name).chmod(0o644)
    keepers = SpecKeepers(folder, names=Instance("blue"))
    assert await keepers.adopt_file(name) is True
    assert await keepers.adopt_file(Instance("blue").claim_spec("missing")) is False
    assert [k.name for k in keepers.kept_files()] == [name]
    async with watching(keepers):
        (folder / name).unlink()
        await until(folder, lambda: holds(folder / name, CONTENT))


async def test_names_are_the_instances_own(tmp_path: Path) -> None:
    keepers = SpecKeepers(tmp_path, names=Instance("blue"))
    for foreign in (Instance().claim_spec("x"), Instance("green").claim_spec("x"), "../escape.json", "vendor.json"):
        with pytest.raises(CdiError, match="is no CDI spec name of instance 'blue'"):
            await keepers.keep_file(foreign, CONTENT)
    assert list(tmp_path.iterdir()) == []


async def test_sweeps_of_each_instance_match_only_its_own_files(tmp_path: Path) -> None:
    # Each instance serves a kind of its own (two instances never serve one resource: the owner
    # claims refuse it), and every one had the kind nic, which leaves every configuration.
    nic = DeviceSnapshot("example.com/nic", [Device("nic-0", edits=ContainerEdits(env={"A": "1"}))])
    instances = {n: SpecKeepers(tmp_path, names=Instance(n)) for n in ("", "blue", "blue-2", "b")}

    def own(name: str) -> str:
        return f"example.com/fpga-{name or 'default'}"

    for name, keepers in instances.items():
        mine = DeviceSnapshot(own(name), [Device("fpga-0", edits=ContainerEdits(env={"A": "1"}))])
        await keepers.keeper(own(name)).ensure(mine)
        await keepers.keeper("example.com/nic").ensure(nic)
        await keepers.keep_file(keepers.names.claim_spec("uid-1"), CONTENT)
        (tmp_path / f".{keepers.names.resource_spec('example.com/old')}.1.2.tmp").write_text("left by a crash")
    before = sorted(p.name for p in tmp_path.iterdir())
    assert "cdiplug.blue.example.com-fpga-blue.json" in before and "cdiplug.blue.claim-uid-1.json" in before
    for name, keepers in instances.items():
        present = sorted(p.name for p in tmp_path.iterdir())
        await keepers.remove_stale([own(name)])  # nic leaves every instance's configuration
        await keepers.remove_stale_files(keepers.names.is_claim_spec)  # and every claim is gone
        theirs = Instance(name)
        left = sorted(p.name for p in tmp_path.iterdir())
        assert theirs.resource_spec(own(name)) in left
        assert [n for n in left if theirs.owns_spec(n) or theirs.is_leftover(n)] == [theirs.resource_spec(own(name))]
        others = [n for n in present if not (theirs.owns_spec(n) or theirs.is_leftover(n))]
        assert set(others) <= set(left)  # nobody else's file went
