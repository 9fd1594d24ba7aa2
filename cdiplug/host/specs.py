"""The owners of cdiplug's per-resource CDI spec files: one :class:`SpecKeeper` per kind.

Every write of a resource's spec file goes through its keeper, one at a time: the device-plugin
front end's snapshot pipeline and its Allocate path both ask :meth:`SpecKeeper.ensure` ("the spec
holding these devices is on disk") and never write themselves. When the file is as last written
and already holds the devices asked for, ``ensure`` costs one ``lstat`` and no thread hop.

The CDI folder is ours to keep right: the kubelet answers a restarted container from the Allocate
response it stored, so the spec must still be there when nobody asks us again.
:meth:`SpecKeepers.watch` (a supervised task of the backend host) watches the folder through
inotify; an event touching a keeper's file, or the folder itself going, makes that keeper re-ensure
the last snapshot it was given, under its lock (bursts coalesce into one check: a spec of ours
that is deleted, edited, truncated, chmodded or replaced is written again within milliseconds;
what stands in the way is moved aside by the writer). Our own writes cause events too; they cost
one ``lstat`` each.

Spec files rendered by their owner (the DRA front end's one spec per prepared claim) are kept the
same way (:meth:`SpecKeepers.keep_file`): the keepers remember the bytes, and the folder watch
writes them again when the file is deleted or changed, as long as the owner's guard
(:meth:`SpecKeepers.guard_files`) says the file is still wanted; :meth:`SpecKeepers.drop_file`
removes one. Every file name is this instance's (:class:`~cdiplug.models.instance.Instance`):
the keepers never write, repair or remove another instance's files.

The boundary: :mod:`cdiplug.cdi.writer` does the blocking work (build, validate, atomic write);
this module decides who writes when.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

from cdiplug.cdi.writer import SpecWriter
from cdiplug.errors import CdiError
from cdiplug.models.devices import DeviceSnapshot
from cdiplug.models.instance import Instance
from cdiplug.toolkit.filewatch import FOLDER, FolderWatch, WatchError

log = logging.getLogger(__name__)

REPAIR_ATTEMPTS = 3
ADOPT_LIMIT = 16 * 1024 * 1024  # bytes of a spec file found on disk that a keeper takes over

FileGuard = Callable[[str], Awaitable[bool]]


async def _always(name: str) -> bool:
    return True


async def _rewrite(write: Callable[[], bool], path: Path) -> bool:
    """``write()`` in a thread, tried again when another change races with ours; logged, never raised."""
    for attempt in range(REPAIR_ATTEMPTS):
        try:
            return await asyncio.to_thread(write)
        except CdiError as exc:
            if attempt == REPAIR_ATTEMPTS - 1:
                log.error("cannot put CDI spec %s right: %s", path, exc)
    return False


class SpecKeeper:
    """The one writer of one kind's spec file."""

    def __init__(self, writer: SpecWriter, kind: str) -> None:
        self.writer = writer
        self.kind = kind
        self._lock = asyncio.Lock()
        self._last: DeviceSnapshot | None = None
        self.repairs = 0  # how often the file had to be written again behind an Allocate's back

    @property
    def path(self) -> Path:
        return self.writer.path_for(self.kind)

    async def ensure(self, snapshot: DeviceSnapshot) -> bool:
        """Return once the file holds ``snapshot``'s devices; True when it was (re)written.

        Raises CdiError (the old file intact) when the spec cannot be built or written.
        """
        self._last = snapshot
        if self.writer.is_current(self.kind, snapshot):
            return False
        async with self._lock:
            if self.writer.is_current(self.kind, snapshot):  # written while this one waited for the lock
                return False
            return await asyncio.to_thread(self.writer.write, self.kind, snapshot)

    async def repair(self) -> bool:
        """Put the file right for the last snapshot asked for (the folder watch calls this).

        True when it had to be written again; a failure is logged (the next event or Allocate
        tries again), never raised.
        """
        snapshot = self._last
        if snapshot is None:
            return False
        async with self._lock:
            written = await _rewrite(lambda: self.writer.write(self.kind, snapshot, verify=True), self.path)
        if written:
            self.repairs += 1
            log.warning("CDI spec %s was missing or changed; written again", self.path)
        return written


class FileKeeper:
    """The one writer of one spec file whose bytes its owner renders (a DRA claim's spec)."""

    def __init__(self, writer: SpecWriter, name: str, guard: FileGuard) -> None:
        self.writer = writer
        self.name = name
        self.guard = guard
        self.content: bytes | None = None
        self.durable = True
        self.repairs = 0
        self._lock = asyncio.Lock()

    @property
    def path(self) -> Path:
        return self.writer.cdi_dir / self.name

    async def ensure(self, content: bytes, *, durable: bool = True) -> bool:
        """Return once the file holds ``content``; True when it was (re)written. CdiError when it cannot be.

        ``durable=False`` skips the fsyncs (:func:`cdiplug.toolkit.atomic.write_atomic`), for a
        file its owner writes again after a reboot anyway; repairs are written the same way.
        """
        async with self._lock:
            self.content = content
            self.durable = durable
            return await asyncio.to_thread(self.writer.write_file, self.name, content, durable=durable)

    async def adopt(self) -> bool:
        """Keep the file as it is on disk (written by an earlier run); False when there is none to keep."""
        async with self._lock:
            self.content = await asyncio.to_thread(self.writer.adopt_file, self.name, ADOPT_LIMIT)
            return self.content is not None

    async def repair(self) -> bool:
        """Write the file again if it went or changed and its owner still wants it; logged, never raised."""
        content = self.content
        if content is None or await asyncio.to_thread(self.writer.file_is_current, self.name, content):
            return False  # our own write's event, or someone else's file
        if self.content is not content:
            return False  # written anew or dropped meanwhile
        try:
            if not await self.guard(self.name):
                return False
        except Exception as exc:  # a guard that cannot tell: leave the file as it is, say so
            log.error("cannot tell whether CDI spec %s is still wanted: %s", self.path, exc)
            return False
        async with self._lock:
            if self.content is not content:
                return False  # written anew or dropped meanwhile
            durable = self.durable
            written = await _rewrite(lambda: self.writer.write_file(self.name, content, verify=True, durable=durable), self.path)
        if written:
            self.repairs += 1
            log.warning("CDI spec %s was missing or changed; written again", self.path)
        return written

    async def drop(self) -> bool:
        """Stop keeping the file and remove it; False when it was not there."""
        async with self._lock:
            self.content = None
            return await asyncio.to_thread(self.writer.remove_file, self.name)


class SpecKeepers:
    """Every kind's keeper, over one CDI folder; stale files of kinds no longer served go."""

    def __init__(self, cdi_dir: Path | str, writer: SpecWriter | None = None, names: Instance | None = None) -> None:
        self.writer = writer if writer is not None else SpecWriter(cdi_dir, names)
        self._keepers: dict[str, SpecKeeper] = {}
        self._files: dict[str, FileKeeper] = {}  # by file name
        self._guard: FileGuard = _always
        self.armed = asyncio.Event()  # set once the folder watch is in place (tests wait for it)

    @property
    def names(self) -> Instance:
        """The names of this instance's files."""
        return self.writer.names

    @property
    def cdi_dir(self) -> Path:
        return self.writer.cdi_dir

    def keepers(self) -> list[SpecKeeper]:
        return list(self._keepers.values())

    async def watch(self) -> None:
        """Keep every keeper's file right while the daemon runs (a task of the backend host).

        Never raises but CancelledError: without inotify the files are still put right at the
        next Allocate, as before, and that is logged once.
        """
        try:
            await asyncio.to_thread(self.writer.ensure_folder)  # a folder to watch from the start
        except CdiError as exc:
            log.error("%s", exc)
        try:
            async with FolderWatch(self.cdi_dir, gone_first=True) as events:
                log.debug("watching CDI folder %s", self.cdi_dir)
                self.armed.set()
                async for names in events:
                    await self._repair(names)
        except WatchError as exc:
            log.error("not watching the CDI folder (specs are put right at the next Allocate only): %s", exc)

    async def _repair(self, names: set[str]) -> None:
        for keeper in list(self._keepers.values()):
            if FOLDER in names or keeper.path.name in names:
                await keeper.repair()
        files = list(self._files) if FOLDER in names else [n for n in names if n in self._files]
        for name in files:
            if (file_keeper := self._files.get(name)) is not None:
                await file_keeper.repair()

    # -- spec files rendered by their owner (DRA claims) --

    def guard_files(self, guard: FileGuard) -> None:
        """``guard(name)`` says whether a kept file is still wanted when the watch would write it
        again (another process sharing the owner's state may have removed it on purpose)."""
        self._guard = guard

    def _file(self, name: str) -> FileKeeper:
        keeper = self._files.get(name)
        if keeper is None:
            keeper = self._files[name] = FileKeeper(self.writer, name, lambda n: self._guard(n))
        return keeper

    def kept_files(self) -> list[FileKeeper]:
        return list(self._files.values())

    async def keep_file(self, name: str, content: bytes, *, durable: bool = True) -> bool:
        """Write this instance's spec ``name`` with ``content`` and keep it so; True when it was (re)written."""
        return await self._file(name).ensure(content, durable=durable)

    async def adopt_file(self, name: str) -> bool:
        """Keep this instance's spec ``name`` as an earlier run left it; False (nothing kept) when it is not there."""
        keeper = self._file(name)
        if await keeper.adopt():
            return True
        self._files.pop(name, None)
        return False

    async def drop_file(self, name: str) -> bool:
        """Stop keeping this instance's spec ``name`` and remove it; False when it was not there."""
        keeper = self._files.pop(name, None)
        if keeper is not None:
            return await keeper.drop()
        return await asyncio.to_thread(self.writer.remove_file, name)

    async def remove_stale_files(self, stale: Callable[[str], bool]) -> list[Path]:
        """Remove (and stop keeping) this instance's spec files whose name ``stale`` accepts; CdiError when one cannot be."""
        for name in [n for n in self._files if stale(n)]:
            self._files.pop(name).content = None
        return await asyncio.to_thread(self.writer.remove_stale_files, stale)

    def keeper(self, kind: str) -> SpecKeeper:
        keeper = self._keepers.get(kind)
        if keeper is None:
            keeper = self._keepers[kind] = SpecKeeper(self.writer, kind)
        return keeper

    async def remove_stale(self, keep_kinds: Iterable[str]) -> None:
        """Remove cdiplug's own files of other kinds; a failure is logged, never fatal."""
        keep = set(keep_kinds)
        for kind in [k for k in self._keepers if k not in keep]:
            del self._keepers[kind]
        try:
            removed = await asyncio.to_thread(self.writer.remove_stale, keep)
        except CdiError as exc:
            log.error("cannot clean up old CDI specs: %s", exc)
            return
        for path in removed:
            if self.writer.names.owns_spec(path.name):
                log.info("removed CDI spec %s (its resource is no longer configured)", path)
            else:
                log.info("removed CDI spec %s of another instance that no longer serves its kind (this one does)", path)
