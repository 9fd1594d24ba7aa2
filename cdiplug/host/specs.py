"""The owners of cdiplug's per-resource CDI spec files: one :class:`SpecKeeper` per kind.

Every write of a resource's spec file goes through its keeper, one at a time: the device-plugin
front end's snapshot pipeline and its Allocate path both ask :meth:`SpecKeeper.ensure` ("the spec
holding these devices is on disk") and never write themselves. When the file is as last written
and already holds the devices asked for, ``ensure`` costs one ``lstat`` and no thread hop.

The boundary: :mod:`cdiplug.cdi.writer` does the blocking work (build, validate, atomic write);
this module decides who writes when. Per-claim specs of the DRA front end are that front end's own.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from pathlib import Path

from ..cdi.writer import SpecWriter
from ..errors import CdiError
from ..model import DeviceSnapshot

log = logging.getLogger(__name__)


class SpecKeeper:
    """The one writer of one kind's spec file."""

    def __init__(self, writer: SpecWriter, kind: str) -> None:
        self.writer = writer
        self.kind = kind
        self._lock = asyncio.Lock()

    @property
    def path(self) -> Path:
        return self.writer.path_for(self.kind)

    async def ensure(self, snapshot: DeviceSnapshot) -> bool:
        """Return once the file holds ``snapshot``'s devices; True when it was (re)written.

        Raises CdiError (the old file intact) when the spec cannot be built or written.
        """
        if self.writer.is_current(self.kind, snapshot):
            return False
        async with self._lock:
            return await asyncio.to_thread(self.writer.write, self.kind, snapshot)


class SpecKeepers:
    """Every kind's keeper, over one CDI folder; stale files of kinds no longer served go."""

    def __init__(self, cdi_dir: Path | str, writer: SpecWriter | None = None) -> None:
        self.writer = writer if writer is not None else SpecWriter(cdi_dir)
        self._keepers: dict[str, SpecKeeper] = {}

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
