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

Format, version 2::

    {"version": 2, "claims": {"<uid>": {"state": "PrepareStarted" | "PrepareCompleted",
      "namespace": …, "name": …, "driver": …, "resource": …, "spec_file": "cdiplug-claim-<uid>.json",
      "devices": [{"request_names": […], "pool": …, "device": …, "device_id": …,
                   "cdi_ids": […], "prepare_group": … | null,
                   "share_id": … | null, "consumed_capacity": [[<capacity>, <quantity>], …],
                   "prepared": true, "release": true, "admin_access": false}],
      "configs": [{"source": "FromClass" | "FromClaim", "requests": […], "parameters": {…}}],
      "boot_id": "<the node's boot ID when the claim was last prepared>" | null,
      "owner": "<the pod UID of the instance preparing it>" | ""}}}

``configs`` are the opaque entries the claim was prepared with (a repeated prepare compares them);
``prepared``, ``release`` and ``admin_access`` per device say how they shaped it (optional, absent:
a plain exclusive preparation, as in files of earlier cdiplug).

``boot_id`` (optional, absent: unknown, as in files of earlier cdiplug) tells a claim prepared
before the node rebooted: what a reboot resets (VFIO bindings, the tmpfs CDI folder) is prepared
again at start (:mod:`.prepare`). ``owner`` (optional) names the instance that started the
preparation (:mod:`.instances`): a start leaves a started claim to its owner while it runs.

Version 1 (cdiplug before the two phases: no ``state``, no ``configs``, written only once a claim
was complete) is upgraded on load, every claim ``PrepareCompleted``, and written back as 2.

Decoding is lenient, as for all our own state (:mod:`cdiplug.toolkit.stateconv`: the record
classes below say per field what a missing or odd value reads as, so a new field is one edit):
unknown keys are ignored (a newer cdiplug may add some), missing optional ones take their defaults, and one claim whose record is unusable is
dropped with the reason logged, the others kept (a copy of the file is kept aside first). A file
that cannot be read as a checkpoint at all (not JSON, a symlink, a FIFO, too big, an unknown
version) is moved aside (``dra-claims.json.corrupt-<time>``) with the reason logged, and the
store starts empty.

Two daemons share the file during a rolling update (the old and the new pod, ``--pod-uid``):
every change takes ``fcntl.flock`` on ``dra-claims.json.lock`` beside it
(:mod:`cdiplug.toolkit.filelock`: waiting at most :data:`LOCK_WAIT` seconds), reads the file again and writes it with only that claim changed, so
neither loses the other's claims (changes asked for at once share one write: 200 claims prepared
together are not 400 writes one after the other); :meth:`ClaimStore.refresh` (at the start of every prepare and
unprepare) reads it again under the lock, so a claim one daemon prepared is unprepared by the
other.

The boundary: values and the file; what a claim means is :mod:`.prepare`'s business.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import logging
import shutil
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
from attrs import frozen

from cdiplug.dra.claims import ConfigEntry
from cdiplug.toolkit import filelock, stateconv, statefile
from cdiplug.toolkit.brief import brief
from cdiplug.toolkit.stateconv import absent, checked, lenient

log = logging.getLogger(__name__)

FILE_NAME = "dra-claims.json"
VERSION = 2
LIMIT = 64 << 20  # some hundred thousand claims; a bigger file is not ours
WHAT = "DRA checkpoint"
LOCK_WAIT = 10.0  # seconds to wait for the other daemon's change; one is a file write


class ClaimState(str, enum.Enum):
    STARTED = "PrepareStarted"
    COMPLETED = "PrepareCompleted"


def _is_file_name(value: str) -> bool:
    return "/" not in value and value not in (".", "..")


@frozen
class PreparedDevice:
    """One device of a claim, as answered to the kubelet."""

    request_names: tuple[str, ...] = attrs.field(metadata=absent([]))
    pool: str
    device: str  # the device's name in the slice
    device_id: str  # the backend's ID
    cdi_ids: tuple[str, ...] = attrs.field(metadata=absent([]))
    prepare_group: str | None = None
    share_id: str | None = attrs.field(default=None, metadata=lenient())  # one share of a device that allows multiple allocations
    # What the share takes: capacity -> quantity (a pair not of two strings is left out when read).
    consumed_capacity: tuple[tuple[str, str], ...] = attrs.field(default=(), metadata=lenient())
    # How the claim's configuration and admin access had it prepared (claim_config): whether the
    # host prepared it (and so whether it holds the device against another claim's release),
    # whether the claim's unprepare releases it, and whether it was for admin access only.
    prepared: bool = attrs.field(default=True, metadata=lenient())
    release: bool = attrs.field(default=True, metadata=lenient())
    admin_access: bool = attrs.field(default=False, metadata=lenient())


@frozen
class PreparedClaim:
    """A claim of one driver: its devices, the CDI spec file written for it, how far it got."""

    uid: str
    namespace: str
    name: str
    driver: str
    resource: str
    devices: tuple[PreparedDevice, ...] = ()
    # A file name in the CDI folder; empty when the claim has no devices.
    spec_file: str = attrs.field(default="", metadata=checked(_is_file_name, "must be a file name"))
    state: ClaimState = ClaimState.COMPLETED
    configs: tuple[ConfigEntry, ...] = ()
    # The node's boot when prepared; None: unknown (so prepared again at the next start).
    boot_id: str | None = attrs.field(default=None, metadata=lenient(lambda v: v is None or 0 < len(v) <= 64))
    # The pod UID of the instance that started preparing it; "": one instance only (a start rolls it back).
    owner: str = attrs.field(default="", metadata=lenient(lambda v: len(v) <= 64))

    @property
    def completed(self) -> bool:
        return self.state is ClaimState.COMPLETED


# -- decoding (lenient: :mod:`cdiplug.toolkit.stateconv`) -----------------------------------------

_conv = stateconv.converter()
# Pairs of two strings; any other entry is left out (a file of another cdiplug).
_conv.register_structure_hook_func(
    lambda t: t == tuple[tuple[str, str], ...],
    lambda v, _: (
        tuple((p[0], p[1]) for p in v if isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p))
        if isinstance(v, list)
        else ()
    ),
)


def _claim(uid: str, data: Any, version: int) -> PreparedClaim:
    what = f"claims[{brief(uid)}]"
    if not isinstance(data, Mapping):
        raise ValueError(f"{what} must be a mapping")
    # Version 1 recorded claims only once complete; version 2 must say how far a claim got.
    state = ClaimState.COMPLETED.value if version == 1 else data.get("state")
    return stateconv.structure(_conv, {**data, "uid": uid, "state": state}, PreparedClaim, what)


@frozen
class Decoded:
    """A checkpoint read: its claims, the version it had, and the claims that had to be dropped."""

    claims: dict[str, PreparedClaim]
    version: int = VERSION
    dropped: tuple[str, ...] = ()  # reasons, one per claim


def decode(text: bytes) -> Decoded:
    """The claims in a checkpoint file (any version this code knows); ValueError when it is none."""
    try:
        data = json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    if not isinstance(data, Mapping):
        raise ValueError("not a JSON object")
    version = data.get("version")
    if version not in (1, VERSION):
        raise ValueError(f"version {brief(version)} is not one this cdiplug reads (1 or {VERSION})")
    claims = data.get("claims", {})
    if not isinstance(claims, Mapping):
        raise ValueError("claims must be a mapping")
    out: dict[str, PreparedClaim] = {}
    dropped: list[str] = []
    for uid, record in claims.items():
        try:
            out[uid] = _claim(uid, record, version)
        except ValueError as exc:
            dropped.append(str(exc))
    return Decoded(out, version, tuple(dropped))


def parse(text: bytes) -> dict[str, PreparedClaim]:
    """The claims in a checkpoint file; ValueError naming the first unusable one."""
    decoded = decode(text)
    if decoded.dropped:
        raise ValueError(decoded.dropped[0])
    return decoded.claims


# -- encoding --------------------------------------------------------------------------------------


def _record(claim: PreparedClaim) -> dict[str, Any]:
    record: dict[str, Any] = _conv.unstructure(claim)
    del record["uid"]
    # How a device was shaped, and its share, are written only where they are not a plain
    # preparation of a whole device (the defaults): such a record stays as earlier cdiplug wrote it.
    record["devices"] = [stateconv.without_lenient_defaults(d, PreparedDevice) for d in record["devices"]]
    return record


def render(claims: Mapping[str, PreparedClaim]) -> bytes:
    out = {"version": VERSION, "claims": {uid: _record(c) for uid, c in sorted(claims.items())}}
    return (json.dumps(out, indent=1, sort_keys=True) + "\n").encode()


# -- the file --------------------------------------------------------------------------------------


def load(path: Path) -> dict[str, PreparedClaim]:
    """Read the checkpoint (blocking); upgraded and written back when it was an older version.

    A missing file is empty; one that is no checkpoint is moved aside; claims that are unusable
    are dropped, logged, and the file as it was kept aside.
    """
    decoded = statefile.load(path, LIMIT, WHAT, decode, lambda: Decoded({}))
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
        save(path, decoded.claims)
        if decoded.version != VERSION:
            log.info(
                "upgraded %s %s from version %s to %s (%d claims)", WHAT, path, decoded.version, VERSION, len(decoded.claims)
            )
    return decoded.claims


def save(path: Path, claims: Mapping[str, PreparedClaim], durable: bool = True) -> None:
    """Write the checkpoint atomically (blocking); StateFileError when it cannot be."""
    statefile.write(path, render(claims), WHAT, durable=durable)


def locked(path: Path, wait: float = LOCK_WAIT) -> contextlib.AbstractContextManager[None]:
    """Hold ``fcntl.flock`` on ``<path>.lock`` (blocking, at most ``wait`` seconds); StateFileError otherwise."""
    return filelock.locked(path.with_name(path.name + ".lock"), f"the {WHAT} {path}", wait=wait)


def _locked_load(path: Path) -> dict[str, PreparedClaim]:
    with locked(path):
        return load(path)


def _locked_change(path: Path, change: Callable[[dict[str, PreparedClaim]], bool], durable: bool) -> dict[str, PreparedClaim]:
    """Under the lock: the file read again, ``change`` applied, written when it says it changed something."""
    with locked(path):
        claims = load(path)
        if change(claims):
            save(path, claims, durable)
        return claims


class ClaimStore:
    """Every claim being prepared or prepared, in memory and in ``<state_dir>/dra-claims.json``."""

    def __init__(self, state_dir: Path) -> None:
        self.path = Path(state_dir) / FILE_NAME
        self._claims: dict[str, PreparedClaim] = {}
        self._lock = asyncio.Lock()
        self._pending: list[tuple[Callable[[dict[str, PreparedClaim]], bool], bool, asyncio.Future[None]]] = []
        self._writer: asyncio.Task[None] | None = None
        self.writes = 0  # file writes done (each holds one or more changes)

    async def load(self) -> None:
        async with self._lock:
            self._claims = await asyncio.to_thread(_locked_load, self.path)

    async def refresh(self) -> None:
        """Read the file again (another daemon may have changed it: a rolling update)."""
        await self.load()

    @contextlib.asynccontextmanager
    async def locked(self) -> AsyncIterator[None]:
        """The file read again and locked across the block: the other daemon records nothing meanwhile.

        The block may read the store, never change it (a change takes the lock itself).
        """
        async with self._lock:
            hold = locked(self.path)
            await asyncio.to_thread(hold.__enter__)
            try:
                self._claims = await asyncio.to_thread(load, self.path)
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
                    self._claims = await asyncio.to_thread(_locked_change, self.path, apply, durable)
                    self.writes += 1
            except Exception as exc:
                for _, _, done in batch:
                    if not done.done():
                        done.set_exception(exc)
                continue
            for _, _, done in batch:
                if not done.done():
                    done.set_result(None)
