"""The PCI backend's state in ``--state-dir``: the step journal, what was bound, and the locks.

Layout under ``<state-dir>/pci/`` (folders 0700, files 0600):

- ``journal/<group>.json`` — the operation in progress on one IOMMU group (bind or restore), with
  the step about to be taken. It is written (atomically: temporary file in the same folder,
  fsync, rename, fsync of the folder) *before* each step, and removed once the operation is done.
  A file left behind means the process died half-way; ``vfio.VfioBinder.recover`` finishes or rolls
  back that operation at start-up (and before touching the group again).
- ``bound/<address>.json`` — each function cdiplug moved to vfio-pci: its original driver and
  network interfaces (so selectors keep matching, and ``unbind``/``release: restore`` know where
  it goes back), the resource and when. Written before the first step of a bind.
- ``locks/<group>.lock`` — an ``flock`` per group, so ``cdiplug vfio bind`` at a shell and the
  daemon never work on the same group at once (a wait is bounded, :data:`LOCK_WAIT`: a process
  stuck on a group fails the other's operation instead of blocking its thread for good).

Group keys and addresses are checked before they become file names, so no name leaves its folder.
"""

from __future__ import annotations

import contextlib
import enum
import json
import logging
import os
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TypeVar

import cattrs
from attrs import field, frozen
from cattrs.v import format_exception

from cdiplug.sdk import STATE_LIMIT, TEMP_SUFFIX, BackendError, decode_text, filelock, fsync_dir, load_json, statefile

from .sysfs import check_address, check_driver, is_address

log = logging.getLogger(__name__)

STATE_FILE_MODE = 0o600  # the journal is ours alone
LOCK_WAIT = 60.0  # seconds to wait for another process's operation on a group (a bind takes seconds at most)

T = TypeVar("T")

_GROUP_KEY = re.compile(r"^([0-9]+|noiommu:[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7])$")


class JournalError(BackendError):
    """The state folder could not be read or written."""


def check_group_key(group: str) -> str:
    """An IOMMU group number, or ``noiommu:<address>`` for a function that has none yet."""
    if not _GROUP_KEY.match(group):
        raise ValueError(f"not an IOMMU group key: {group!r}")
    return group


class Op(str, enum.Enum):
    BIND = "bind"
    RESTORE = "restore"


class Step(str, enum.Enum):
    """The steps of an operation, journaled before each is taken."""

    RECORD = "record"  # record original drivers (bound/<address>.json)
    OVERRIDE = "driver_override"  # write vfio-pci to driver_override
    UNBIND = "unbind"  # unbind from the current driver
    PROBE = "drivers_probe"  # ask the PCI core to probe: vfio-pci takes it
    VERIFY = "verify"  # driver link and /dev/vfio/<group>
    CLEAR_OVERRIDE = "clear_override"  # restore: empty driver_override
    UNBIND_VFIO = "unbind_vfio"  # restore: unbind from vfio-pci
    REBIND = "rebind"  # restore: bind the original driver (or probe)


def _checked(check: Callable[[str], str]) -> Callable[[object, object, str], None]:
    """An attrs validator from a ``check_*`` function: what the state files hold becomes paths."""

    def validate(_instance: object, _attribute: object, value: str | None) -> None:
        if value is not None:
            check(value)

    return validate


@frozen
class PlannedFunction:
    address: str = field(validator=_checked(check_address))
    original_driver: str | None = field(default=None, validator=_checked(check_driver))
    netdevs: tuple[str, ...] = field(default=(), converter=tuple[str, ...])


@frozen
class JournalEntry:
    op: Op
    group: str = field(validator=_checked(check_group_key))
    functions: tuple[PlannedFunction, ...] = field(converter=tuple[PlannedFunction, ...])
    step: Step = Step.RECORD
    function: str | None = field(default=None, validator=_checked(check_address))
    resource: str | None = None
    started_at: float = 0.0

    @property
    def addresses(self) -> tuple[str, ...]:
        return tuple(f.address for f in self.functions)


@frozen
class BoundRecord:
    address: str = field(validator=_checked(check_address))
    group: str = field(validator=_checked(check_group_key))
    original_driver: str | None = field(default=None, validator=_checked(check_driver))
    netdevs: tuple[str, ...] = field(default=(), converter=tuple[str, ...])
    resource: str | None = None
    bound_at: float = 0.0


_conv = cattrs.Converter(forbid_extra_keys=False)


def _why(exc: BaseException, _type: type | None) -> str:
    """What cattrs found wrong at one place of a state file: the check's own words."""
    return str(exc) if isinstance(exc, ValueError) else format_exception(exc, _type)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists
        return True
    return True


def _file_name(group: str) -> str:
    return check_group_key(group).replace(":", "_")


class Journal:
    """The state folder of the PCI backend (see the module docstring). Blocking: use from a thread."""

    def __init__(self, state_dir: Path) -> None:
        self.base = Path(state_dir) / "pci"
        self.journal_dir = self.base / "journal"
        self.bound_dir = self.base / "bound"
        self.locks_dir = self.base / "locks"

    def ensure(self) -> None:
        try:
            for folder in (self.base, self.journal_dir, self.bound_dir, self.locks_dir):
                folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise JournalError(f"cannot create the state folder {self.base}: {exc.strerror}") from exc

    # -- the journal -------------------------------------------------------------------------------

    def write(self, entry: JournalEntry) -> None:
        path = self.journal_dir / f"{_file_name(entry.group)}.json"
        self._store(path, entry, f"the journal for IOMMU group {entry.group}")

    def done(self, group: str) -> None:
        path = self.journal_dir / f"{_file_name(group)}.json"
        try:
            path.unlink(missing_ok=True)
            fsync_dir(self.journal_dir)
        except OSError as exc:
            raise JournalError(f"cannot remove {path}: {exc.strerror}") from exc

    def pending(self, group: str | None = None) -> list[JournalEntry]:
        """Operations left half done, oldest first (one group's only, when ``group`` is given)."""
        if group is not None:
            paths = [self.journal_dir / f"{_file_name(group)}.json"]
        else:
            try:
                paths = sorted(self.journal_dir.glob("*.json"))
            except OSError:
                return []
        entries = []
        for path in paths:
            entry = self._load(path, JournalEntry, lambda e: _file_name(e.group))
            if entry is not None:
                entries.append(entry)
        return sorted(entries, key=lambda e: e.started_at)

    def _store(self, path: Path, value: JournalEntry | BoundRecord, what: str) -> None:
        self.ensure()
        data = json.dumps(_conv.unstructure(value), indent=1, sort_keys=True).encode()
        try:
            statefile.write(path, data, what, STATE_FILE_MODE)
        except statefile.StateFileError as exc:
            raise JournalError(str(exc)) from exc

    def _load(self, path: Path, cls: type[T], stem: Callable[[T], str]) -> T | None:
        """The value in ``path``; None when there is none or it is unusable (then moved aside).

        ``stem`` gives the file name the value belongs under: a file naming another group or
        function (an entry for group 7 in ``5.json``) would be acted on under the wrong lock or
        restore a function cdiplug never bound, so it counts as unusable too.
        """

        def parse(data: bytes) -> T:
            try:
                value = _conv.structure(load_json(decode_text(data, str(path), "state file"), str(path)), cls)
            except cattrs.BaseValidationError as exc:
                raise ValueError("; ".join(cattrs.transform_error(exc, format_exception=_why))) from exc
            if f"{stem(value)}.json" != path.name:
                raise ValueError(f"it belongs in {stem(value)}.json")
            return value

        # Bounded, never through a symlink, never a FIFO or a folder; a file we cannot understand
        # (the validators check every address, group and driver name, as they become sysfs and
        # state paths) must not stop the daemon for good: cdiplug.toolkit.statefile moves it aside
        # (``<name>.corrupt-<time>``, never read again) with the reason logged.
        try:
            return statefile.load(path, STATE_LIMIT, "state file", parse, lambda: None)
        except statefile.StateFileError as exc:
            log.error("%s", exc)
            return None

    def clean_leftovers(self) -> list[Path]:
        """Remove the temporary files of writes that a dead process left (``.<name>.<pid>.<tid>.tmp``).

        A process killed while writing a state file leaves its temporary file; the state file
        itself is whole (old or new). Files of a live process (``cdiplug vfio bind`` at a shell)
        are left alone. Returns what was removed.
        """
        removed = []
        for folder in (self.journal_dir, self.bound_dir):
            try:
                names = os.listdir(folder)
            except OSError:
                continue
            for name in names:
                parts = name.split(".")
                if not (name.startswith(".") and name.endswith(TEMP_SUFFIX) and len(parts) >= 5 and parts[-3].isdigit()):
                    continue
                if _alive(int(parts[-3])):
                    continue
                with contextlib.suppress(OSError):
                    (folder / name).unlink()
                    removed.append(folder / name)
                    log.info("removed %s, left by a process that ended while writing it", folder / name)
        return removed

    # -- bound functions ---------------------------------------------------------------------------

    def record_bound(self, record: BoundRecord) -> None:
        path = self.bound_dir / f"{check_address(record.address)}.json"
        self._store(path, record, f"the original driver of {record.address}")

    def forget_bound(self, address: str) -> None:
        try:
            (self.bound_dir / f"{check_address(address)}.json").unlink(missing_ok=True)
        except OSError as exc:
            raise JournalError(f"cannot remove the record of {address}: {exc.strerror}") from exc

    def bound(self, address: str) -> BoundRecord | None:
        return self._load(self.bound_dir / f"{check_address(address)}.json", BoundRecord, lambda r: r.address)

    def all_bound(self) -> Mapping[str, BoundRecord]:
        try:
            names = sorted(os.listdir(self.bound_dir))
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise JournalError(f"cannot list {self.bound_dir}: {exc.strerror}") from exc
        found = {}
        for name in names:
            if name.endswith(".json") and is_address(name[:-5]):
                record = self.bound(name[:-5])
                if record is not None:
                    found[name[:-5]] = record
        return found

    # -- locks -------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def locked(self, group: str, wait: float = LOCK_WAIT) -> Iterator[None]:
        """Hold the group's ``flock`` (waiting at most ``wait`` seconds for other processes to let go); JournalError otherwise."""
        self.ensure()
        path = self.locks_dir / f"{_file_name(group)}.lock"
        try:
            fd = filelock.hold(path, f"IOMMU group {group}", wait=wait)
        except statefile.StateFileError as exc:
            raise JournalError(str(exc)) from exc
        try:
            yield
        finally:
            os.close(fd)  # closing drops the lock
