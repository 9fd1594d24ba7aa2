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

Decoding is lenient, as for all our own state: unknown keys are ignored (a newer cdiplug may add
some), missing optional ones take their defaults, and one claim whose record is unusable is
dropped with the reason logged, the others kept (a copy of the file is kept aside first). A file
that cannot be read as a checkpoint at all (not JSON, a symlink, a FIFO, too big, an unknown
version) is moved aside (``dra-claims.json.corrupt-<time>``) with the reason logged, and the
store starts empty.

Two daemons share the file during a rolling update (the old and the new pod, ``--pod-uid``):
every change takes ``fcntl.flock`` on ``dra-claims.json.lock`` beside it (waiting at most
:data:`LOCK_WAIT` seconds), reads the file again and writes it with only that claim changed, so
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
import fcntl
import json
import logging
import os
import shutil
import stat
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs
from attrs import frozen

from cdiplug.dra.claims import ConfigEntry, ConfigSource
from cdiplug.toolkit import statefile
from cdiplug.toolkit.brief import brief

log = logging.getLogger(__name__)

FILE_NAME = "dra-claims.json"
VERSION = 2
LIMIT = 64 << 20  # some hundred thousand claims; a bigger file is not ours
WHAT = "DRA checkpoint"
LOCK_WAIT = 10.0  # seconds to wait for the other daemon's change; one is a file write


class ClaimState(str, enum.Enum):
    STARTED = "PrepareStarted"
    COMPLETED = "PrepareCompleted"


@frozen
class PreparedDevice:
    """One device of a claim, as answered to the kubelet."""

    request_names: tuple[str, ...]
    pool: str
    device: str  # the device's name in the slice
    device_id: str  # the backend's ID
    cdi_ids: tuple[str, ...]
    prepare_group: str | None = None
    share_id: str | None = None  # one share of a device that allows multiple allocations
    consumed_capacity: tuple[tuple[str, str], ...] = ()  # what the share takes: capacity -> quantity
    # How the claim's configuration and admin access had it prepared (claim_config): whether the
    # host prepared it (and so whether it holds the device against another claim's release),
    # whether the claim's unprepare releases it, and whether it was for admin access only.
    prepared: bool = True
    release: bool = True
    admin_access: bool = False


@frozen
class PreparedClaim:
    """A claim of one driver: its devices, the CDI spec file written for it, how far it got."""

    uid: str
    namespace: str
    name: str
    driver: str
    resource: str
    devices: tuple[PreparedDevice, ...]
    spec_file: str  # a file name in the CDI folder; empty when the claim has no devices
    state: ClaimState = ClaimState.COMPLETED
    configs: tuple[ConfigEntry, ...] = ()
    boot_id: str | None = None  # the node's boot when prepared; None: unknown
    owner: str = ""  # the pod UID of the instance that started preparing it; "": one instance only

    @property
    def completed(self) -> bool:
        return self.state is ClaimState.COMPLETED


# -- decoding (lenient) --------------------------------------------------------------------------


def _strs(value: Any, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{what} must be a list of strings")
    return tuple(value)


def _str(data: Mapping[str, Any], key: str, what: str) -> str:
    value = data.get(key)
    if not isinstance(value, str):
        raise ValueError(f"{what}.{key} must be a string, got {brief(value)}")
    return value


def _device(data: Any, what: str) -> PreparedDevice:
    if not isinstance(data, Mapping):
        raise ValueError(f"{what} must be a mapping")
    group = data.get("prepare_group")
    if group is not None and not isinstance(group, str):
        raise ValueError(f"{what}.prepare_group must be a string or null")
    return PreparedDevice(
        request_names=_strs(data.get("request_names", []), f"{what}.request_names"),
        pool=_str(data, "pool", what),
        device=_str(data, "device", what),
        device_id=_str(data, "device_id", what),
        cdi_ids=_strs(data.get("cdi_ids", []), f"{what}.cdi_ids"),
        prepare_group=group,
        share_id=share if isinstance(share := data.get("share_id"), str) else None,
        consumed_capacity=_pairs(data.get("consumed_capacity")),
        prepared=_flag(data, "prepared", True),
        release=_flag(data, "release", True),
        admin_access=_flag(data, "admin_access", False),
    )


def _pairs(value: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, list):
        return ()  # lenient: absent in files of earlier cdiplug
    return tuple((p[0], p[1]) for p in value if isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p))


def _flag(data: Mapping[str, Any], key: str, default: bool) -> bool:
    value = data.get(key, default)
    return value if isinstance(value, bool) else default  # lenient: a file of another cdiplug


def _config(data: Any, what: str) -> ConfigEntry:
    if not isinstance(data, Mapping):
        raise ValueError(f"{what} must be a mapping")
    try:
        source = ConfigSource(data.get("source"))
    except ValueError:
        raise ValueError(f"{what}.source must be FromClass or FromClaim") from None
    parameters = data.get("parameters", {})
    if not isinstance(parameters, Mapping):
        raise ValueError(f"{what}.parameters must be a mapping")
    return ConfigEntry(source=source, requests=_strs(data.get("requests", []), f"{what}.requests"), parameters=parameters)


def _claim(uid: str, data: Any, version: int) -> PreparedClaim:
    what = f"claims[{brief(uid)}]"
    if not isinstance(data, Mapping):
        raise ValueError(f"{what} must be a mapping")
    devices = data.get("devices", [])
    if not isinstance(devices, list):
        raise ValueError(f"{what}.devices must be a list")
    spec_file = _str(data, "spec_file", what) if "spec_file" in data else ""
    if "/" in spec_file or spec_file in (".", ".."):
        raise ValueError(f"{what}.spec_file must be a file name")
    if version == 1:
        state = ClaimState.COMPLETED  # version 1 recorded claims only once complete
    else:
        try:
            state = ClaimState(data.get("state"))
        except ValueError:
            raise ValueError(f"{what}.state must be PrepareStarted or PrepareCompleted, got {brief(data.get('state'))}") from None
    configs = data.get("configs", [])
    if not isinstance(configs, list):
        raise ValueError(f"{what}.configs must be a list")
    boot_id = data.get("boot_id")
    if not isinstance(boot_id, str) or not 0 < len(boot_id) <= 64:
        boot_id = None  # lenient: unknown, so the claim is prepared again at the next start
    owner = data.get("owner")
    if not isinstance(owner, str) or len(owner) > 64:
        owner = ""  # lenient: no owner known, so a start rolls a started claim back
    return PreparedClaim(
        uid=uid,
        namespace=_str(data, "namespace", what),
        name=_str(data, "name", what),
        driver=_str(data, "driver", what),
        resource=_str(data, "resource", what),
        devices=tuple(_device(d, f"{what}.devices[{i}]") for i, d in enumerate(devices)),
        spec_file=spec_file,
        state=state,
        configs=tuple(_config(c, f"{what}.configs[{i}]") for i, c in enumerate(configs)),
        boot_id=boot_id,
        owner=owner,
    )


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


_DEFAULTS: dict[str, Any] = {"prepared": True, "release": True, "admin_access": False, "share_id": None, "consumed_capacity": []}


def _default(key: str, value: Any) -> bool:
    return key in _DEFAULTS and (list(value) if isinstance(value, tuple) else value) == _DEFAULTS[key]


def _record(claim: PreparedClaim) -> dict[str, Any]:
    record = {k: v for k, v in attrs.asdict(claim, recurse=True).items() if k != "uid"}
    record["state"] = claim.state.value
    # How a device was shaped, and its share, are written only where they are not a plain
    # preparation of a whole device (the defaults): such a record stays as earlier cdiplug wrote it.
    record["devices"] = [{k: v for k, v in d.items() if not _default(k, v)} for d in record["devices"]]
    record["configs"] = [
        {"source": c.source.value, "requests": list(c.requests), "parameters": c.parameters} for c in claim.configs
    ]
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


@contextlib.contextmanager
def locked(path: Path, wait: float = LOCK_WAIT) -> Iterator[None]:
    """Hold ``fcntl.flock`` on ``<path>.lock`` (blocking, at most ``wait`` seconds); StateFileError otherwise."""
    lock = path.with_name(path.name + ".lock")
    try:
        lock.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # a --state-dir not made yet
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o600)
    except OSError as exc:
        raise statefile.StateFileError(f"cannot open the lock {lock} of the {WHAT}: {exc.strerror or exc}") from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise statefile.StateFileError(f"the lock {lock} of the {WHAT} is not a regular file")
        deadline = time.monotonic() + wait
        delay = 0.001
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise statefile.StateFileError(f"the {WHAT} {path} stayed locked by another process for {wait:g} s") from None
                time.sleep(delay)  # flock has no timeout of its own; a blocking thread could not be given up
                delay = min(delay * 2, 0.05)
        yield
    finally:
        os.close(fd)  # releases the lock


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
