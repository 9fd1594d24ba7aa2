"""cdiplug.toolkit.filewatch: FolderWatch on a real folder through real Linux inotify (no fakes).

Covers: files created, written, renamed and removed are reported by name; a burst arriving while
the consumer is busy comes as one batch; the folder removed reports "." and the watch re-arms once
the folder is back (with ``gone_first``: reported while gone, and again while it stays gone); a
folder missing at start is waited for; closing ends the iteration.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cdiplug.toolkit.filewatch import FOLDER, FolderWatch


async def next_batch(batches: AsyncIterator[set[str]]) -> set[str]:
    return await asyncio.wait_for(anext(batches), 3)


@pytest.fixture
async def watched(short_tmp: Path) -> AsyncIterator[tuple[Path, AsyncIterator[set[str]]]]:
    async with FolderWatch(short_tmp) as watch:
        yield short_tmp, aiter(watch)


async def test_create_write_rename_remove(watched: tuple[Path, AsyncIterator[set[str]]]) -> None:
    folder, batches = watched
    (folder / "a.yaml").write_text("x")
    assert "a.yaml" in await next_batch(batches)
    (folder / "a.yaml").rename(folder / "b.yaml")
    names: set[str] = set()
    while not {"a.yaml", "b.yaml"} <= names:  # rename: one event per name, maybe two batches
        names |= await next_batch(batches)
    (folder / "b.yaml").unlink()
    assert await next_batch(batches) == {"b.yaml"}


async def test_a_burst_while_busy_is_one_batch(watched: tuple[Path, AsyncIterator[set[str]]]) -> None:
    folder, batches = watched
    for i in range(20):
        (folder / f"f{i}").write_text(str(i))
    # Nothing awaited since the writes began: every event is queued in the kernel, read in one go.
    assert await next_batch(batches) == {f"f{i}" for i in range(20)}


async def test_atomic_replace_reports_the_target(watched: tuple[Path, AsyncIterator[set[str]]]) -> None:
    folder, batches = watched
    (folder / ".tmp").write_text("new")
    os.replace(folder / ".tmp", folder / "health.yaml")
    names: set[str] = set()
    while "health.yaml" not in names:
        names |= await next_batch(batches)


async def test_folder_removed_then_back(short_tmp: Path) -> None:
    folder = short_tmp / "kubelet"
    folder.mkdir()
    async with FolderWatch(folder, rearm_interval=0.01) as watch:
        batches = aiter(watch)
        shutil.rmtree(folder)
        removed = asyncio.create_task(next_batch(batches))
        await asyncio.sleep(0.05)
        folder.mkdir()  # the batch with "." arrives once the watch is armed again
        assert FOLDER in await removed
        (folder / "kubelet.sock").write_text("")
        names: set[str] = set()
        while "kubelet.sock" not in names:
            names |= await next_batch(batches)


async def test_folder_missing_at_start_is_waited_for(short_tmp: Path) -> None:
    folder = short_tmp / "later"
    async with FolderWatch(folder, rearm_interval=0.01) as watch:
        batches = aiter(watch)
        first = asyncio.create_task(next_batch(batches))
        await asyncio.sleep(0.05)
        assert not first.done()
        folder.mkdir()
        assert await first == {FOLDER}
        (folder / "x").write_text("")
        assert "x" in await next_batch(batches)


async def test_close_ends_the_iteration(short_tmp: Path) -> None:
    watch = FolderWatch(short_tmp)
    async with watch:
        (short_tmp / "a").write_text("")
        assert "a" in await next_batch(aiter(watch))
    batches = aiter(watch)
    with pytest.raises(StopAsyncIteration):
        await next_batch(batches)


async def test_gone_first_reports_at_once_and_again_while_the_folder_stays_gone(short_tmp: Path) -> None:
    """For a consumer that re-creates the folder itself (the CDI spec keepers): the "." batch comes
    while the folder is still gone, again for as long as it stays gone, and once more when the
    watch is armed again; events after that are reported as usual."""
    folder = short_tmp / "cdi"
    folder.mkdir()
    async with FolderWatch(folder, rearm_interval=0.01, gone_first=True) as watch:
        batches = aiter(watch)
        shutil.rmtree(folder)
        assert FOLDER in await next_batch(batches)
        assert not folder.exists()  # reported while gone: the consumer may act now
        assert await next_batch(batches) == {FOLDER}  # still gone: said again
        folder.mkdir()
        while await next_batch(batches) != {FOLDER} or not folder.is_dir():
            pass  # the "still gone" reports end with the one after re-arming
        (folder / "x").write_text("x")
        batch = await next_batch(batches)
        while "x" not in batch:
            batch = await next_batch(batches)
