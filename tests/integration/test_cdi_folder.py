"""The CDI folder is kept right while the daemon runs, without waiting for an Allocate.

An in-process Daemon with the fake backend, the kubelet stand-in over real gRPC, and real inotify:
after one Allocate has written the spec, it is deleted, edited, truncated, chmodded, replaced by a
symlink, a folder or a FIFO, the whole CDI folder is removed or replaced by a file, and each time
the test waits (on its own inotify watch, not by polling) until the spec is back byte for byte,
with a deadline so it cannot hang. Obstacles end up moved aside, never followed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import stat
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import yaml

from cdiplug.daemon import Daemon
from cdiplug.models.world import World
from cdiplug.testing import KubeletStandIn, started_daemon
from cdiplug.toolkit.filewatch import FolderWatch

FPGA = "example.com/fpga"
SPEC = "cdiplug-example.com-fpga.json"
DEADLINE = 5.0  # generous for a loaded CI machine; the repair itself takes milliseconds


@contextlib.asynccontextmanager
async def serving(world: World, short_tmp: Path) -> AsyncIterator[tuple[Daemon, KubeletStandIn]]:
    config = short_tmp / "config.yaml"
    config.write_text(yaml.safe_dump({"resources": [{"name": FPGA, "backend": "fake", "options": {"count": 2}}]}))
    async with KubeletStandIn(world.kubelet_dir) as kubelet, started_daemon(config, world) as d:
        await kubelet.wait_registered(FPGA)
        yield d, kubelet


def spec_is(path: Path, good: bytes) -> bool:
    try:
        st = path.lstat()
        return stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o644 and path.read_bytes() == good
    except OSError:
        return False


async def until_right(folder: Path, good: bytes) -> float:
    """Seconds until the spec in ``folder`` is ``good`` again, woken by inotify events (on the
    folder, or on its parent while the folder is no folder)."""
    started = time.monotonic()
    path = folder / SPEC
    async with asyncio.timeout(DEADLINE):
        while not spec_is(path, good):
            watched = folder if folder.is_dir() else folder.parent
            async with FolderWatch(watched) as watch:  # armed before the next look: no event missed
                if not spec_is(path, good):
                    await anext(aiter(watch))
    return time.monotonic() - started


def edit_in_place(p: Path) -> None:
    with p.open("r+b") as f:
        f.write(b"[")


def truncate(p: Path) -> None:
    os.truncate(p, 10)


def replace_by_symlink(p: Path) -> None:
    copy = p.with_name("elsewhere.json.txt")
    copy.write_bytes(p.read_bytes())
    p.unlink()
    p.symlink_to(copy.name)


def replace_by_folder(p: Path) -> None:
    p.unlink()
    p.mkdir()


def replace_by_fifo(p: Path) -> None:
    p.unlink()
    os.mkfifo(p, 0o644)


TAMPERING: dict[str, Callable[[Path], None]] = {
    "delete": Path.unlink,
    "edit": edit_in_place,
    "truncate": truncate,
    "chmod": lambda p: p.chmod(0o600),
    "symlink": replace_by_symlink,
    "folder": replace_by_folder,
    "fifo": replace_by_fifo,
}


async def test_every_kind_of_tampering_is_put_right_without_an_allocate(world: World, short_tmp: Path) -> None:
    async with serving(world, short_tmp) as (d, kubelet):
        await kubelet.allocate(FPGA, ["fpga-0"])
        path = world.cdi_dir / SPEC
        good = path.read_bytes()
        allocator = d.node.front_end("device-plugin").allocator(FPGA)
        calls = []
        real = allocator.allocate

        async def counted(requests):  # type: ignore[no-untyped-def]
            calls.append(requests)
            return await real(requests)

        allocator.allocate = counted  # type: ignore[method-assign]
        took = {}
        for name, tamper in TAMPERING.items():
            tamper(path)
            took[name] = await until_right(world.cdi_dir, good)
        assert calls == []  # no Allocate helped
        assert max(took.values()) < DEADLINE  # each within milliseconds here; the deadline only stops a hang
        assert d.node.host.specs.keeper(FPGA).repairs >= len(TAMPERING) - 1  # the last may still be counting
        moved = [world.cdi_dir / n for n in os.listdir(world.cdi_dir) if n.startswith(f"{SPEC}.moved-aside-")]
        # The folder is always moved aside; a symlink or FIFO is, unless a write already under way
        # renamed our file over it (which replaces the entry itself, never what it points to).
        assert 1 <= len(moved) <= 3 and any(m.is_dir() and not m.is_symlink() for m in moved)
        assert (world.cdi_dir / "elsewhere.json.txt").read_bytes() == good  # never written through
        assert not [n for n in os.listdir(world.cdi_dir) if n.endswith(".tmp")]
        # An Allocate still finds everything in order.
        await kubelet.allocate(FPGA, ["fpga-1"])
        assert len(calls) == 1  # the counter counts


def remove_at_once(folder: Path, scratch: Path) -> None:
    """The folder gone in one step: the daemon puts its spec back as soon as rmtree unlinks it,
    which would make rmtree's own rmdir fail (the folder is not empty again)."""
    gone = scratch / f"gone-{len(list(scratch.iterdir()))}"
    folder.rename(gone)
    shutil.rmtree(gone)


async def test_the_folder_removed_or_replaced_by_a_file(world: World, short_tmp: Path) -> None:
    async with serving(world, short_tmp) as (d, kubelet):
        await kubelet.allocate(FPGA, ["fpga-0"])
        good = (world.cdi_dir / SPEC).read_bytes()
        remove_at_once(world.cdi_dir, short_tmp)
        await until_right(world.cdi_dir, good)
        assert stat.S_IMODE(world.cdi_dir.stat().st_mode) == 0o755
        remove_at_once(world.cdi_dir, short_tmp)
        world.cdi_dir.write_text("a file in the folder's place")
        await until_right(world.cdi_dir, good)
        assert (world.cdi_dir.parent / "cdi.moved-aside-1").read_text() == "a file in the folder's place"


@pytest.mark.parametrize("name", ["cdiplug-claim-1234.json", "vendor-other.json"])
async def test_files_that_are_not_ours_are_left_alone(world: World, short_tmp: Path, name: str) -> None:
    async with serving(world, short_tmp) as (d, kubelet):
        await kubelet.allocate(FPGA, ["fpga-0"])
        other = world.cdi_dir / name
        other.write_text("{}")
        other.chmod(0o600)
        good = (world.cdi_dir / SPEC).read_bytes()
        (world.cdi_dir / SPEC).unlink()
        await until_right(world.cdi_dir, good)
        assert other.read_text() == "{}" and stat.S_IMODE(other.stat().st_mode) == 0o600
