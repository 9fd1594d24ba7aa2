"""Claims being prepared and prepared, checkpointed in ``--state-dir``: what a restarted daemon must finish or undo.

:class:`ClaimStore` keeps every claim of the DRA front end (all drivers, one file
``dra-claims.json``) in memory and on disk; each change rewrites the file (:mod:`cdiplug.toolkit.statefile`:
atomic, 0600, in a thread). Two phases per claim, as NVIDIA's driver does:

- ``PrepareStarted`` is recorded *before* any side effect (the backend's preparation, a VFIO
  bind, the claim's CDI spec), naming every device the preparation will touch;
- ``PrepareCompleted`` once the devices are prepared and the spec written.

So a crash at any step leaves a record of what may have been touched: :mod:`.prepare` rolls a
started claim back at the next start and releases it on unprepare. A claim is dropped only after
its spec is gone and its devices released.

The records, their file format and how leniently they are read: :mod:`.records`.

Two daemons share the file during a rolling update (the old and the new pod, ``--pod-uid``):
every change takes ``fcntl.flock`` on ``dra-claims.json.lock`` beside it
(:mod:`cdiplug.toolkit.filelock`: waiting at most :data:`LOCK_WAIT` seconds), reads the file
again and writes it with only that claim changed, so neither loses the other's claims;
:meth:`ClaimStore.refresh` (at the start of every prepare and unprepare) reads it again under
the lock, so a claim one daemon prepared is unprepared by the other.

What it costs (:class:`CheckpointFile`): a file read again that holds the bytes this process
last read or wrote is not decoded again, and a write renders only the claims that changed, so a
change costs the same with 1 or 500 claims held; changes asked for at once share one write
(group commit: 200 claims prepared together are not 400 writes one after the other, and not 400
fsyncs). ``PrepareStarted`` is written without fsync (it guards against the process dying; what
a power loss resets needs no guard), ``PrepareCompleted`` and a removal with one.

The boundary: values and the file; what a claim means is :mod:`.prepare`'s business.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path

from cdiplug.dra.records import VERSION, ClaimState, Decoded, Lines, PreparedClaim, PreparedDevice, decode, parse, render
from cdiplug.toolkit import filelock, statefile

log = logging.getLogger(__name__)

__all__ = [
    "FILE_NAME",
    "VERSION",
    "CheckpointFile",
    "ClaimState",
    "ClaimStore",
    "Decoded",
    "PreparedClaim",
    "PreparedDevice",
    "decode",
    "load",
    "locked",
    "parse",
    "render",
    "save",
]

FILE_NAME = "dra-claims.json"
LIMIT = 64 << 20  # some hundred thousand claims; a bigger file is not ours
WHAT = "DRA checkpoint"
LOCK_WAIT = 10.0  # seconds to wait for the other daemon's change; one is a file write


# -- the file --------------------------------------------------------------------------------------


class CheckpointFile:
    """The checkpoint at ``path`` (blocking calls), remembering what it held when last read or
    written here: a file of the same bytes is not decoded again, an unchanged claim not rendered
    again (the other daemon of a rolling update writes a file of other bytes)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._text: bytes | None = None
        self._claims: dict[str, PreparedClaim] = {}
        self._lines: Lines = {}

    def _parse(self, text: bytes) -> Decoded:
        if text == self._text:
            return Decoded(dict(self._claims))
        decoded = decode(text)
        if decoded.version == VERSION and not decoded.dropped:
            self._text, self._claims = text, dict(decoded.claims)
        return decoded

    def load(self) -> dict[str, PreparedClaim]:
        """Read the checkpoint; upgraded and written back when it was an older version.

        A missing file is empty; one that is no checkpoint is moved aside; claims that are unusable
        are dropped, logged, and the file as it was kept aside.
        """
        path = self.path
        decoded = statefile.load(path, LIMIT, WHAT, self._parse, lambda: Decoded({}))
        if decoded.dropped:
            aside = statefile.aside_name(path)
            try:
                shutil.copyfile(path, aside, follow_symlinks=False)
            except OSError as exc:
                log.warning("cannot keep a copy of %s %s: %s", WHAT, path, exc)
            for reason in decoded.dropped:
                log.error(
                    "%s %s: dropped a claim whose record is unusable (%s); the file as it was: %s", WHAT, path, reason, aside.name
                )
        if decoded.version != VERSION or decoded.dropped:
            self.save(decoded.claims)
            if decoded.version != VERSION:
                log.info(
                    "upgraded %s %s from version %s to %s (%d claims)", WHAT, path, decoded.version, VERSION, len(decoded.claims)
                )
        return decoded.claims

    def save(self, claims: Mapping[str, PreparedClaim], durable: bool = True) -> None:
        """Write the checkpoint atomically; StateFileError when it cannot be."""
        text = render(claims, self._lines)
        self._text = None  # a failed write may leave either
        statefile.write(self.path, text, WHAT, durable=durable)
        self._text, self._claims = text, dict(claims)

    def locked_load(self) -> dict[str, PreparedClaim]:
        with locked(self.path):
            return self.load()

    def locked_change(self, change: Callable[[dict[str, PreparedClaim]], bool], durable: bool) -> dict[str, PreparedClaim]:
        """Under the lock: the file read again, ``change`` applied, written when it says it changed something."""
        with locked(self.path):
            claims = self.load()
            if change(claims):
                self.save(claims, durable)
            return claims


def load(path: Path) -> dict[str, PreparedClaim]:
    """Read the checkpoint at ``path`` (:meth:`CheckpointFile.load`)."""
    return CheckpointFile(path).load()


def save(path: Path, claims: Mapping[str, PreparedClaim], durable: bool = True) -> None:
    """Write the checkpoint at ``path`` atomically; StateFileError when it cannot be."""
    CheckpointFile(path).save(claims, durable)


def locked(path: Path, wait: float = LOCK_WAIT) -> contextlib.AbstractContextManager[None]:
    """Hold ``fcntl.flock`` on ``<path>.lock`` (blocking, at most ``wait`` seconds); StateFileError otherwise."""
    return filelock.locked(path.with_name(path.name + ".lock"), f"the {WHAT} {path}", wait=wait)


class ClaimStore:
    """Every claim being prepared or prepared, in memory and in ``<state_dir>/dra-claims.json``."""

    def __init__(self, state_dir: Path) -> None:
        self.path = Path(state_dir) / FILE_NAME
        self.file = CheckpointFile(self.path)
        self._claims: dict[str, PreparedClaim] = {}
        self._lock = asyncio.Lock()
        self._pending: list[tuple[Callable[[dict[str, PreparedClaim]], bool], bool, asyncio.Future[None]]] = []
        self._writer: asyncio.Task[None] | None = None
        self.writes = 0  # file writes done (each holds one or more changes)

    async def load(self) -> None:
        async with self._lock:
            self._claims = await asyncio.to_thread(self.file.locked_load)

    async def refresh(self) -> None:
        """Read the file again (another daemon may have changed it: a rolling update).

        A change that changes nothing: refreshes asked for at once, and changes asked for with
        them, share one read of the file under its lock (a burst of prepares does not read it once each).
        """
        await self._change(lambda claims: False, False)

    @contextlib.asynccontextmanager
    async def locked(self) -> AsyncIterator[None]:
        """The file read again and locked across the block: the other daemon records nothing meanwhile.

        The block may read the store, never change it (a change takes the lock itself).
        """
        async with self._lock:
            hold = locked(self.path)
            await asyncio.to_thread(hold.__enter__)
            try:
                self._claims = await asyncio.to_thread(self.file.load)
                yield
            finally:
                hold.__exit__(None, None, None)

    def get(self, uid: str) -> PreparedClaim | None:
        return self._claims.get(uid)

    def all(self) -> list[PreparedClaim]:
        return list(self._claims.values())

    def started(self) -> list[PreparedClaim]:
        """Claims whose preparation began and never completed."""
        return [c for c in self._claims.values() if not c.completed]

    async def put(self, claim: PreparedClaim, durable: bool = True) -> None:
        """Record ``claim``; ``durable=False`` survives the process, not a power loss (statefile.write)."""

        def change(claims: dict[str, PreparedClaim]) -> bool:
            claims[claim.uid] = claim
            return True

        await self._change(change, durable)

    async def remove(self, uid: str) -> None:
        def change(claims: dict[str, PreparedClaim]) -> bool:
            return claims.pop(uid, None) is not None

        await self._change(change, True)

    async def _change(self, change: Callable[[dict[str, PreparedClaim]], bool], durable: bool) -> None:
        """Until ``change`` is in the file. Changes asked for while a write runs go into the next
        write together (one file write, fsync'd if any of them must be): with many claims at once,
        each write costs what one does, not one per claim. A caller returns only once its change
        is written; a failed write fails every change in it."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append((change, durable, done))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_pending(), name="dra-checkpoint-write")
        await done

    async def _write_pending(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []

            def apply(claims: dict[str, PreparedClaim]) -> bool:
                changed = False
                for change, _, _ in batch:
                    changed = change(claims) or changed
                return changed

            try:
                async with self._lock:
                    durable = any(d for _, d, _ in batch)
                    self._claims = await asyncio.to_thread(self.file.locked_change, apply, durable)
                    self.writes += 1
            except Exception as exc:
                for _, _, done in batch:
                    if not done.done():
                        done.set_exception(exc)
                continue
            for _, _, done in batch:
                if not done.done():
                    done.set_result(None)
