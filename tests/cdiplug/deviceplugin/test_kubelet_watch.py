"""cdiplug.deviceplugin.kubelet_watch: kubelet restarts seen in the kubelet folder.

Real inotify on a short temporary folder, real unix sockets bound there for ``kubelet.sock`` and
ours. Covers: a new kubelet.sock (first one, replaced one, same inode number reused), our socket
removed, the whole folder wiped and re-created, a burst coalescing into one event, and changes
that must not cause an event (our own socket being restarted, other plugins' files).
"""

from __future__ import annotations

import asyncio
import shutil
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cdiplug.deviceplugin.kubelet_watch import KubeletEvent, KubeletWatch

OURS = "example.com-fpga.sock"


def bind(path: Path) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.close()  # the file stays: enough for the watch, which never connects


class Folder:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.serving = {OURS}

    def own(self) -> set[str]:
        return set(self.serving)


@pytest.fixture
def folder(short_tmp: Path) -> Folder:
    path = short_tmp / "kubelet"
    path.mkdir()
    bind(path / "kubelet.sock")
    bind(path / OURS)
    return Folder(path)


@pytest.fixture
async def events(folder: Folder) -> AsyncIterator[AsyncIterator[KubeletEvent]]:
    async with KubeletWatch(folder.path, folder.own) as watch:
        yield aiter(watch)


async def next_event(events: AsyncIterator[KubeletEvent]) -> KubeletEvent:
    return await asyncio.wait_for(anext(events), 3)


async def test_kubelet_socket_recreated_is_a_restart(folder: Folder, events: AsyncIterator[KubeletEvent]) -> None:
    (folder.path / "kubelet.sock").unlink()
    bind(folder.path / "kubelet.sock")
    event = await next_event(events)
    assert event == KubeletEvent(kubelet_restarted=True, first_kubelet=False, kubelet_present=True, missing_sockets=frozenset())


async def test_kubelet_wipe_and_restart_is_one_event(folder: Folder, events: AsyncIterator[KubeletEvent]) -> None:
    # What a restarting kubelet does: every socket goes, then kubelet.sock comes back.
    for entry in folder.path.iterdir():
        entry.unlink()
    (folder.path / "kubelet_internal_checkpoint").write_text("{}")
    bind(folder.path / "kubelet.sock")
    event = await next_event(events)
    assert event.kubelet_restarted and event.kubelet_present
    assert event.missing_sockets == {OURS}
    # Nothing else is pending: the next event is the next change.
    bind(folder.path / OURS)
    (folder.path / OURS).unlink()
    assert (await next_event(events)).missing_sockets == {OURS}


async def test_our_socket_removed(folder: Folder, events: AsyncIterator[KubeletEvent]) -> None:
    (folder.path / OURS).unlink()
    event = await next_event(events)
    assert not event.kubelet_restarted
    assert event.missing_sockets == {OURS}


async def test_no_event_for_sockets_being_restarted_or_others_files(folder: Folder, events: AsyncIterator[KubeletEvent]) -> None:
    folder.serving.clear()  # our server is restarting: its socket is not there for now
    (folder.path / OURS).unlink()
    bind(folder.path / "other-vendor.com-gpu.sock")
    (folder.path / "kubelet_internal_checkpoint").write_text("{}")
    # The first event must be this later, real change, not any of the above.
    (folder.path / "kubelet.sock").unlink()
    bind(folder.path / "kubelet.sock")
    event = await next_event(events)
    assert event.kubelet_restarted
    assert event.missing_sockets == frozenset()


async def test_kubelet_gone_then_back(folder: Folder, events: AsyncIterator[KubeletEvent]) -> None:
    (folder.path / "kubelet.sock").unlink()
    (folder.path / OURS).unlink()
    event = await next_event(events)  # the kubelet is down and our socket is gone: serve it again
    assert not event.kubelet_restarted and not event.kubelet_present
    bind(folder.path / OURS)
    bind(folder.path / "kubelet.sock")
    event = await next_event(events)
    assert event.kubelet_restarted and not event.first_kubelet and event.kubelet_present


async def test_first_kubelet_appearing(short_tmp: Path) -> None:
    path = short_tmp / "kubelet"
    path.mkdir()
    async with KubeletWatch(path, lambda: ()) as watch:
        events = aiter(watch)
        bind(path / "kubelet.sock")
        event = await next_event(events)
    assert event.kubelet_restarted and event.first_kubelet


async def test_folder_removed_and_recreated(folder: Folder, events: AsyncIterator[KubeletEvent]) -> None:
    shutil.rmtree(folder.path)
    folder.path.mkdir()
    bind(folder.path / "kubelet.sock")
    event = await next_event(events)
    if not event.kubelet_restarted:  # the folder's removal may be reported before it is back
        assert event.missing_sockets == {OURS}
        event = await next_event(events)
    assert event.kubelet_restarted
    assert event.missing_sockets == {OURS}


async def test_kubelet_folder_missing_at_start(short_tmp: Path) -> None:
    path = short_tmp / "kubelet"
    async with KubeletWatch(path, lambda: ()) as watch:
        events = aiter(watch)
        path.mkdir()
        bind(path / "kubelet.sock")
        event = await next_event(events)
    assert event.kubelet_restarted and event.first_kubelet


async def test_same_inode_number_still_counts(folder: Folder, events: AsyncIterator[KubeletEvent]) -> None:
    # Remove and re-create in one burst: the file system may reuse the inode number.
    watch_check = KubeletEvent(kubelet_restarted=True, first_kubelet=False, kubelet_present=True, missing_sockets=frozenset())
    for _ in range(3):
        (folder.path / "kubelet.sock").unlink()
        bind(folder.path / "kubelet.sock")
        assert await next_event(events) == watch_check
