"""Noticing kubelet restarts from the kubelet's device-plugin folder.

A restarting kubelet wipes its folder (our sockets go) and creates a new ``kubelet.sock``; both
mean every resource must serve and register again. :class:`KubeletWatch` watches the folder with
:class:`~cdiplug.toolkit.filewatch.FolderWatch` (inotify, no polling) and, after a burst of changes has
settled (a short quiet period, bounded), compares the folder with what it expects:

- ``kubelet.sock`` was touched and is there, or is a different socket than before,
- one of our sockets (those the caller says it serves right now) is gone.

Either yields one :class:`KubeletEvent`. Our own socket creations and removals cause no event:
the caller's list of sockets is read only after the burst settles.

The boundary: this module only observes; the device-plugin front end (``cdiplug.deviceplugin.frontend``) re-serves and re-registers.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import Self

from attrs import frozen

from cdiplug.toolkit.filewatch import FOLDER, FolderWatch

log = logging.getLogger(__name__)

KUBELET_SOCKET = "kubelet.sock"
QUIET = 0.02  # a burst has settled after this long without a change
MAX_DELAY = 0.15  # but never wait longer than this after the first change


@frozen
class KubeletEvent:
    """What changed in the kubelet folder after one settled burst."""

    kubelet_restarted: bool  # kubelet.sock is a new socket (a restart, or the first kubelet)
    first_kubelet: bool  # no kubelet socket had been seen before this one
    kubelet_present: bool
    missing_sockets: frozenset[str]  # our sockets that are gone

    @property
    def needs_action(self) -> bool:
        return self.kubelet_restarted or bool(self.missing_sockets)


def _identity(path: Path) -> tuple[int, int, int] | None:
    # The inode alone is not enough: a file system may hand a new socket the number just freed.
    try:
        st = path.lstat()
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


class KubeletWatch:
    """``async with KubeletWatch(dir, own_sockets) as w: async for event in w: ...``.

    ``own_sockets`` returns the file names of the sockets we serve right now; it is called after
    each burst, so sockets being restarted can be left out of it meanwhile.
    """

    def __init__(
        self,
        kubelet_dir: Path,
        own_sockets: Callable[[], Iterable[str]],
        *,
        quiet: float = QUIET,
        max_delay: float = MAX_DELAY,
    ) -> None:
        self.kubelet_dir = Path(kubelet_dir)
        self._own_sockets = own_sockets
        self._quiet = quiet
        self._max_delay = max_delay
        self._folder = FolderWatch(self.kubelet_dir)
        self._batches: asyncio.Queue[set[str]] = asyncio.Queue()
        self._pump: asyncio.Task[None] | None = None
        self._kubelet: tuple[int, int, int] | None = None
        self._ever_seen = False

    async def __aenter__(self) -> Self:
        await self._folder.__aenter__()
        # Read the kubelet socket only once the watch is armed, so no restart falls in between.
        self._kubelet = _identity(self.kubelet_dir / KUBELET_SOCKET)
        self._ever_seen = self._kubelet is not None
        self._pump = asyncio.get_running_loop().create_task(self._pump_batches(), name="kubelet-watch:inotify")
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._pump is not None:
            self._pump.cancel()
            await asyncio.gather(self._pump, return_exceptions=True)
            self._pump = None
        self._folder.close()

    async def _pump_batches(self) -> None:
        # A separate task: timing out on an async generator's __anext__ would close the generator.
        async for names in self._folder:
            self._batches.put_nowait(names)

    def _relevant(self, names: set[str]) -> bool:
        return FOLDER in names or KUBELET_SOCKET in names or not names.isdisjoint(self._own_sockets())

    async def _settle(self, names: set[str]) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._max_delay
        while (timeout := min(self._quiet, deadline - loop.time())) > 0:
            try:
                async with asyncio.timeout(timeout):
                    names |= await self._batches.get()
            except TimeoutError:
                return

    def check(self, names: Iterable[str] = ()) -> KubeletEvent:
        """Compare the folder with what we expect after changes to ``names``; updates the known
        kubelet socket. Nothing but the kubelet's start touches kubelet.sock, so a change to it
        that leaves a socket there is a restart even when the inode looks the same."""
        current = _identity(self.kubelet_dir / KUBELET_SOCKET)
        touched = KUBELET_SOCKET in names or FOLDER in names
        restarted = current is not None and (current != self._kubelet or touched)
        first = restarted and not self._ever_seen
        if current is not None:
            # A vanished kubelet.sock is remembered as the old one, so its return counts as new.
            self._kubelet = current
            self._ever_seen = True
        missing = frozenset(n for n in self._own_sockets() if not (self.kubelet_dir / n).exists())
        return KubeletEvent(
            kubelet_restarted=restarted,
            first_kubelet=first,
            kubelet_present=current is not None,
            missing_sockets=missing,
        )

    def __aiter__(self) -> AsyncIterator[KubeletEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[KubeletEvent]:
        while True:
            names = await self._batches.get()
            if not self._relevant(names):
                continue
            await self._settle(names)
            event = self.check(names)
            if event.needs_action:
                log.debug("kubelet folder changed (%s): %s", ", ".join(sorted(names)), event)
                yield event
            elif FOLDER in names and not os.path.isdir(self.kubelet_dir):
                log.warning("kubelet folder %s is gone; waiting for it", self.kubelet_dir)
