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

The boundary: :mod:`cdiplug.cdi.writer` does the blocking work (build, validate, atomic write);
this module decides who writes when. Per-claim specs of the DRA front end
(``cdiplug-claim-*.json``) are that front end's own: the watch never touches them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from pathlib import Path

from cdiplug.cdi.writer import SpecWriter
from cdiplug.errors import CdiError
from cdiplug.models.devices import DeviceSnapshot
from cdiplug.toolkit.filewatch import FOLDER, FolderWatch, WatchError

log = logging.getLogger(__name__)

REPAIR_ATTEMPTS = 3


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
        for attempt in range(REPAIR_ATTEMPTS):  # another change may race with ours: look again
            try:
                async with self._lock:
                    written = await asyncio.to_thread(self.writer.write, self.kind, snapshot, verify=True)
                break
            except CdiError as exc:
                if attempt == REPAIR_ATTEMPTS - 1:
                    log.error("cannot put CDI spec %s right: %s", self.path, exc)
                    return False
        if written:
            self.repairs += 1
            log.warning("CDI spec %s was missing or changed; written again", self.path)
        return written


class SpecKeepers:
    """Every kind's keeper, over one CDI folder; stale files of kinds no longer served go."""

    def __init__(self, cdi_dir: Path | str, writer: SpecWriter | None = None) -> None:
        self.writer = writer if writer is not None else SpecWriter(cdi_dir)
        self._keepers: dict[str, SpecKeeper] = {}

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
                async for names in events:
                    await self._repair(names)
        except WatchError as exc:
            log.error("not watching the CDI folder (specs are put right at the next Allocate only): %s", exc)

    async def _repair(self, names: set[str]) -> None:
        for keeper in list(self._keepers.values()):
            if FOLDER in names or keeper.path.name in names:
                await keeper.repair()

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
            log.info("removed CDI spec %s (its resource is no longer configured)", path)
