"""Writes cdiplug's CDI spec files: one per kind, atomically, only when their content changes.

File names are ``cdiplug-<vendor>-<class>.json`` in the CDI folder (DESIGN.md); the prefix marks
the files cdiplug owns, so :meth:`SpecWriter.remove_stale` never touches anyone else's. A write is
a temporary file in the same folder (a name runtimes ignore: it does not end in ``.json``),
fsync, rename over the old file, fsync the folder: a runtime sees the old spec or the new one,
never half of one, and a failure leaves the old file as it was.

``write`` is on the Allocate hot path. When nothing changed it costs one ``os.stat``: the writer
remembers, per kind, the snapshot it last wrote, the bytes, and the file's identity (inode, size,
mtime, mode); a file removed or changed behind its back is rewritten.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Iterable
from pathlib import Path

from attrs import frozen

from ..atomic import TEMP_SUFFIX, write_atomic
from ..errors import CdiError
from ..model import DeviceSnapshot
from ..names import spec_file_name
from .build import build_spec
from .spec import to_json

FILE_MODE = 0o644
DIR_MODE = 0o755
OWN_PREFIX = "cdiplug-"
# Per-claim specs of the DRA front end (cdiplug.dra.claimspec): that front end cleans them up
# against its own checkpoint; this writer never removes them.
CLAIM_PREFIX = "cdiplug-claim-"


@frozen
class _Stamp:
    """Enough of ``os.stat`` to notice that someone else replaced or edited the file."""

    ino: int
    size: int
    mtime_ns: int
    mode: int

    @classmethod
    def of(cls, st: os.stat_result) -> _Stamp:
        return cls(st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode)


@frozen
class _Written:
    snapshot: DeviceSnapshot
    content: bytes
    stamp: _Stamp


class SpecWriter:
    """Keeps one spec file per kind in ``cdi_dir`` in step with the snapshots it is given.

    Blocking (call it through ``asyncio.to_thread`` from the event loop); safe to call from
    several threads at once.
    """

    def __init__(self, cdi_dir: Path | str) -> None:
        self.cdi_dir = Path(cdi_dir)
        self._written: dict[str, _Written] = {}
        self._lock = threading.Lock()

    def path_for(self, kind: str) -> Path:
        """``example.com/fpga`` -> ``<cdi_dir>/cdiplug-example.com-fpga.json`` (kind checked first)."""
        return self.cdi_dir / spec_file_name(kind)

    def render(self, kind: str, snapshot: DeviceSnapshot) -> bytes:
        """The exact bytes :meth:`write` would write for ``snapshot``."""
        return to_json(build_spec(kind, snapshot))

    def write(self, kind: str, snapshot: DeviceSnapshot) -> bool:
        """Make the file of ``kind`` hold every device of ``snapshot``; True when the file changed.

        A snapshot without devices removes the file (a spec without devices is invalid). Raises
        CdiError (the old file intact) when the spec cannot be built or written.
        """
        path = self.path_for(kind)
        with self._lock:
            last = self._written.get(kind)
            stamp = _stat(path)
            if last is not None and stamp == last.stamp and same_spec(last.snapshot, snapshot):
                return False
            if not snapshot.devices:
                self._written.pop(kind, None)
                return _unlink(path)
            content = self.render(kind, snapshot)
            if stamp is not None and stamp.mode & 0o7777 == FILE_MODE:
                if last is not None and stamp == last.stamp and content == last.content:
                    self._written[kind] = _Written(snapshot, content, stamp)
                    return False
                if last is None and _read(path) == content:  # as left by our previous run
                    self._written[kind] = _Written(snapshot, content, stamp)
                    return False
            self._written.pop(kind, None)
            new_stamp = self._replace(path, content)
            self._written[kind] = _Written(snapshot, content, new_stamp)
            return True

    def is_current(self, kind: str, snapshot: DeviceSnapshot) -> bool:
        """Whether the file of ``kind`` is as we last wrote it and holds ``snapshot``'s spec.

        One ``lstat``: the Allocate hot path asks this before anything else.
        """
        last = self._written.get(kind)
        if last is None:
            return False
        try:
            return _stat(self.path_for(kind)) == last.stamp and same_spec(last.snapshot, snapshot)
        except CdiError:
            return False

    def remove_stale(self, keep_kinds: Iterable[str]) -> list[Path]:
        """Remove cdiplug's own spec files (``cdiplug-*.json``) for kinds not in ``keep_kinds``.

        Per-claim specs (``cdiplug-claim-*.json``) are the DRA front end's and are left alone.
        Also removes temporary files a crash may have left behind. Never touches other files.
        Returns the paths removed.
        """
        keep = {spec_file_name(k) for k in keep_kinds}
        removed: list[Path] = []
        with self._lock:
            try:
                entries = list(os.scandir(self.cdi_dir))
            except FileNotFoundError:
                return []
            except OSError as exc:
                raise CdiError(f"cannot list CDI folder {self.cdi_dir}: {exc.strerror}") from exc
            for entry in entries:
                name = entry.name
                ours = (
                    name.startswith(OWN_PREFIX)
                    and not name.startswith(CLAIM_PREFIX)
                    and name.endswith(".json")
                    and name not in keep
                )
                leftover = name.startswith("." + OWN_PREFIX) and name.endswith(TEMP_SUFFIX)
                if not (ours or leftover) or not entry.is_file(follow_symlinks=False):
                    continue
                if _unlink(Path(entry.path)):
                    removed.append(Path(entry.path))
            self._written = {k: w for k, w in self._written.items() if spec_file_name(k) in keep}
        return sorted(removed)

    def _replace(self, path: Path, content: bytes) -> _Stamp:
        """Write ``content`` to a temporary file beside ``path`` and rename it over ``path``."""
        try:
            self.cdi_dir.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        except OSError as exc:
            raise CdiError(f"cannot create CDI folder {self.cdi_dir}: {exc.strerror}") from exc
        try:
            stamp = _Stamp.of(write_atomic(path, content, FILE_MODE))
        except OSError as exc:
            raise CdiError(f"cannot write CDI spec {path}: {exc.strerror or exc}") from exc
        return stamp


def same_spec(old: DeviceSnapshot | None, new: DeviceSnapshot) -> bool:
    """Whether the spec of ``new`` equals that of ``old``: it holds IDs and edits, not health."""
    if old is None:
        return False
    if old is new:
        return True
    if old.common_edits != new.common_edits or len(old.devices) != len(new.devices):
        return False
    return all(a is b or (a.id == b.id and a.edits == b.edits) for a, b in zip(old.devices, new.devices))


def _stat(path: Path) -> _Stamp | None:
    try:
        return _Stamp.of(os.stat(path, follow_symlinks=False))
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CdiError(f"cannot stat CDI spec {path}: {exc.strerror}") from exc


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def _unlink(path: Path) -> bool:
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False
    except OSError as exc:
        if exc.errno == errno.EISDIR:
            return False
        raise CdiError(f"cannot remove {path}: {exc.strerror}") from exc
