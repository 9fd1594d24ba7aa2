"""Writes cdiplug's CDI spec files: one per kind, atomically, only when their content changes.

File names are ``cdiplug-<vendor>-<class>.json`` in the CDI folder, or ``cdiplug.<instance>.<vendor>-<class>.json``
for a named instance (:class:`~cdiplug.models.instance.Instance`, ``docs/architecture.md``); the
prefix marks the files this instance owns, so :meth:`SpecWriter.remove_stale` (:func:`.sweep.sweep`)
never touches anyone else's. Besides one spec per kind, the writer keeps files of given bytes
(:meth:`SpecWriter.write_file`: the DRA front end's per-claim specs) the same way. A write is
a temporary file in the same folder (a name runtimes ignore: it does not end in ``.json``),
fsync, rename over the old file, fsync the folder: a runtime sees the old spec or the new one,
never half of one, and a failure leaves the old file as it was.

``write`` is on the Allocate hot path. When nothing changed it costs one ``os.lstat``: the writer
remembers, per kind, the snapshot it last wrote, the bytes, and the file's identity (device,
inode, size, mtime, ctime, mode with the file type; ctime cannot be set back by anyone but the
kernel), never following a symlink; a file removed or changed behind its back is rewritten. What
stands in the way at a spec's path and is no regular file (a folder, a symlink, a FIFO) is moved
aside to ``<name>.moved-aside-<n>`` (a name runtimes ignore) and reported, never followed or
read. A folder the writer creates gets mode 0755 whatever the umask.
"""

from __future__ import annotations

import logging
import os
import stat as stat_module
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from cdiplug.cdi.sweep import sweep, unlink
from cdiplug.errors import CdiError, InputError
from cdiplug.models.devices import DeviceSnapshot
from cdiplug.models.instance import Instance
from cdiplug.toolkit.atomic import make_dirs, write_atomic
from cdiplug.toolkit.files import read_bounded
from cdiplug.toolkit.tally import CDI_WRITE_FAILURES

log = logging.getLogger(__name__)

FILE_MODE = 0o644
DIR_MODE = 0o755
MOVED_ASIDE = ".moved-aside-"


class _Stamp:
    """Enough of ``os.stat`` to notice that someone else replaced or edited the file.

    Internal to this module, so a plain class (no attrs class to build at start-up); compared
    and hashed by value, never changed after it is made.
    """

    __slots__ = ("dev", "ino", "size", "mtime_ns", "ctime_ns", "mode")

    def __init__(self, dev: int, ino: int, size: int, mtime_ns: int, ctime_ns: int, mode: int) -> None:
        self.dev = dev
        self.ino = ino
        self.size = size
        self.mtime_ns = mtime_ns
        self.ctime_ns = ctime_ns
        self.mode = mode  # with the file type: a folder or a symlink never equals a file we wrote

    def _key(self) -> tuple[int, int, int, int, int, int]:
        return (self.dev, self.ino, self.size, self.mtime_ns, self.ctime_ns, self.mode)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Stamp) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return "_Stamp(dev={}, ino={}, size={}, mtime_ns={}, ctime_ns={}, mode={})".format(*self._key())

    @classmethod
    def of(cls, st: os.stat_result) -> _Stamp:
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode)

    @property
    def regular(self) -> bool:
        return stat_module.S_ISREG(self.mode)


class _Written:
    """What was last written: the snapshot, the content's size and digest (not the bytes: a spec
    of thousands of devices is most of a megabyte), and the file's stamp. Internal, never
    changed after it is made (a plain class, as :class:`_Stamp`)."""

    __slots__ = ("snapshot", "size", "digest", "stamp")

    def __init__(self, snapshot: DeviceSnapshot | None, size: int, digest: bytes, stamp: _Stamp) -> None:
        self.snapshot = snapshot
        self.size = size
        self.digest = digest
        self.stamp = stamp

    @classmethod
    def of(cls, snapshot: DeviceSnapshot | None, content: bytes, stamp: _Stamp) -> _Written:
        return cls(snapshot, len(content), _digest(content), stamp)

    def holds(self, content: bytes | None) -> bool:
        return content is not None and len(content) == self.size and _digest(content) == self.digest


def _digest(content: bytes) -> bytes:
    import hashlib  # on the first spec write, after the servers started

    return hashlib.sha256(content).digest()


class SpecWriter:
    """Keeps one spec file per kind in ``cdi_dir`` in step with the snapshots it is given.

    Blocking (call it through ``asyncio.to_thread`` from the event loop); safe to call from
    several threads at once.
    """

    def __init__(self, cdi_dir: Path | str, names: Instance | None = None) -> None:
        self.cdi_dir = Path(cdi_dir)
        self.names = names if names is not None else Instance()
        self._written: dict[str, _Written] = {}  # by kind
        self._files: dict[str, _Written] = {}  # files of given bytes, by name
        self._paths: dict[str, Path] = {}
        self._lock = threading.Lock()

    def path_for(self, kind: str) -> Path:
        """``example.com/fpga`` -> ``<cdi_dir>/cdiplug-example.com-fpga.json`` (kind checked first)."""
        path = self._paths.get(kind)
        if path is None:
            path = self.cdi_dir / self.names.resource_spec(kind)  # raises for a bad kind: never remembered
            if len(self._paths) < 1024:
                self._paths[kind] = path
        return path

    def render(self, kind: str, snapshot: DeviceSnapshot) -> bytes:
        """The exact bytes :meth:`write` would write for ``snapshot``."""
        from cdiplug.cdi.build import render_spec  # on first use: building specs is not needed to start serving

        return render_spec(kind, snapshot)

    def write(self, kind: str, snapshot: DeviceSnapshot, *, verify: bool = False) -> bool:
        """Make the file of ``kind`` hold every device of ``snapshot``; True when the file changed.

        A snapshot without devices removes the file (a spec without devices is invalid). Raises
        CdiError (the old file intact) when the spec cannot be built or written. ``verify`` also
        compares the bytes when the stamp is unchanged: an edit within the same clock tick as our
        write keeps every timestamp (the folder watch asks for this; Allocate does not).
        """
        path = self.path_for(kind)
        with self._lock:
            last = self._written.get(kind)
            stamp = _stat(path)
            unchanged = last is not None and stamp == last.stamp
            if unchanged and same_spec(last.snapshot if last else None, snapshot):
                assert last is not None
                if not verify or last.holds(_read(path, last.size)):
                    return False
                unchanged, stamp = False, _stat(path)  # same stamp, other bytes: look again, rewrite
            if not snapshot.devices:
                self._written.pop(kind, None)
                return unlink(path)
            return self._put(self._written, kind, path, snapshot, self.render(kind, snapshot), stamp, unchanged)

    def write_file(self, name: str, content: bytes, *, verify: bool = False, durable: bool = True) -> bool:
        """Make the file ``name`` of the CDI folder hold ``content``; True when the file changed.

        As :meth:`write`, for a spec rendered by its owner (a DRA claim's): one ``lstat`` when the
        file is as last written with these bytes (``verify`` reads them too). ``name`` is one of
        this instance's spec names (CdiError otherwise: never a path that leaves the folder).
        """
        if not self.names.owns_spec(name) or "/" in name:
            raise CdiError(f"{name[:120]!r} is no CDI spec name of {self.names.label}")
        path = self.cdi_dir / name
        with self._lock:
            last = self._files.get(name)
            stamp = _stat(path)
            unchanged = last is not None and stamp == last.stamp
            if unchanged and last is not None and last.holds(content) and (not verify or last.holds(_read(path, last.size))):
                return False
            if unchanged and verify:
                unchanged, stamp = False, _stat(path)  # same stamp, other bytes: look again, rewrite
            return self._put(self._files, name, path, None, content, stamp, unchanged, durable=durable)

    def file_is_current(self, name: str, content: bytes) -> bool:
        """Whether the file ``name`` is as :meth:`write_file` last wrote it, with ``content`` (one ``lstat``)."""
        last = self._files.get(name)
        if last is None or not last.holds(content):
            return False
        try:
            return _stat(self.cdi_dir / name) == last.stamp
        except CdiError:
            return False

    def remove_file(self, name: str) -> bool:
        """Forget the file ``name`` (kept by :meth:`write_file`) and remove it; False when it was not there."""
        if not self.names.owns_spec(name) or "/" in name:
            raise CdiError(f"{name[:120]!r} is no CDI spec name of {self.names.label}")
        with self._lock:
            self._files.pop(name, None)
            return unlink(self.cdi_dir / name)

    def adopt_file(self, name: str, limit: int) -> bytes | None:
        """The bytes of this instance's spec ``name`` as it is on disk (a regular file of mode 0644,
        at most ``limit`` bytes), remembered as written by :meth:`write_file`; None when there is none."""
        if not self.names.owns_spec(name) or "/" in name:
            raise CdiError(f"{name[:120]!r} is no CDI spec name of {self.names.label}")
        path = self.cdi_dir / name
        with self._lock:
            stamp = _stat(path)
            if stamp is None or not stamp.regular or stamp.mode & 0o7777 != FILE_MODE:
                return None
            content = _read(path, limit)
            if content is None or _stat(path) != stamp:
                return None
            self._files[name] = _Written.of(None, content, stamp)
            return content

    def _put(
        self,
        written: dict[str, _Written],
        key: str,
        path: Path,
        snapshot: DeviceSnapshot | None,
        content: bytes,
        stamp: _Stamp | None,
        unchanged: bool,
        *,
        durable: bool = True,
    ) -> bool:
        """Write ``content`` at ``path`` unless it is there already; remember it as ``written[key]``."""
        last = written.get(key)
        if stamp is not None and stamp.regular and stamp.mode & 0o7777 == FILE_MODE:
            if last is not None and unchanged and last.holds(content):
                written[key] = _Written.of(snapshot, content, stamp)
                return False
            if last is None and _read(path, len(content)) == content:  # as left by our previous run
                written[key] = _Written.of(snapshot, content, stamp)
                return False
        if stamp is not None and not stamp.regular:
            self._move_aside(path, stamp)
        elif stamp is not None and last is not None and not unchanged:
            log.warning("CDI spec %s was changed behind cdiplug's back; writing it again", path)
        written.pop(key, None)
        try:
            new_stamp = self._replace(path, content, durable=durable)
        except CdiError:
            CDI_WRITE_FAILURES.add(key if snapshot is not None else "claim")  # owner-rendered files are claims' specs
            raise
        written[key] = _Written.of(snapshot, content, new_stamp)
        return True

    def is_current(self, kind: str, snapshot: DeviceSnapshot) -> bool:
        """Whether the file of ``kind`` is as we last wrote it and holds ``snapshot``'s spec.

        One ``lstat`` (a symlink or a folder at the path is never current): the Allocate hot path
        asks this before anything else.
        """
        last = self._written.get(kind)
        if last is None:
            return False
        try:
            return _stat(self.path_for(kind)) == last.stamp and same_spec(last.snapshot, snapshot)
        except CdiError:
            return False

    def remove_stale(self, keep_kinds: Iterable[str]) -> list[Path]:
        """Remove this instance's per-kind spec files for kinds not in ``keep_kinds``.

        Per-claim specs are their owner's (:meth:`remove_stale_files`). Also removes temporary
        files a crash may have left behind. Never touches anyone else's files, with one exception:
        another instance's spec of a kind this instance serves now. This instance holds the claim
        on the resource (:mod:`cdiplug.host.owners`), so that instance no longer serves it, and two
        specs of one kind in one folder make every device of it unresolvable for the runtime.
        Returns the paths removed.
        """
        kinds = list(keep_kinds)
        keep = {self.names.resource_spec(k) for k in kinds}
        names = self.names

        def stale(name: str) -> bool:
            if any(names.is_others_resource_spec(name, k) for k in kinds):
                return True
            return (names.is_resource_spec(name) and name not in keep) or names.is_leftover(name)

        with self._lock:
            removed = sweep(self.cdi_dir, stale)
            self._written = {k: w for k, w in self._written.items() if names.resource_spec(k) in keep}
        return removed

    def remove_stale_files(self, stale: Callable[[str], bool]) -> list[Path]:
        """Remove this instance's spec files whose name ``stale`` accepts (and forget them)."""
        with self._lock:
            removed = sweep(self.cdi_dir, lambda name: self.names.owns_spec(name) and stale(name))
            for path in removed:
                self._files.pop(path.name, None)
        return removed

    def _replace(self, path: Path, content: bytes, *, durable: bool = True) -> _Stamp:
        """Write ``content`` to a temporary file beside ``path`` and rename it over ``path``."""
        self.ensure_folder()
        try:
            written = write_atomic(path, content, FILE_MODE, durable=durable)
        except OSError as exc:
            raise CdiError(f"cannot write CDI spec {path}: {exc.strerror or exc}") from exc
        # The stamp after the rename (which may change the ctime), if it is still our file as we
        # wrote it; else the one before, which then differs and has it written again.
        after = _stat(path)
        if after is not None and (after.ino, after.size, after.mode) == (written.st_ino, len(content), written.st_mode):
            return after
        return _Stamp.of(written)

    def ensure_folder(self) -> None:
        """Create the CDI folder (and missing parents) with mode 0755, whatever the umask."""
        found = _stat(self.cdi_dir)
        if found is not None and not stat_module.S_ISDIR(found.mode) and not self.cdi_dir.is_dir():
            self._move_aside(self.cdi_dir, found)  # a file where the folder belongs
        try:
            make_dirs(self.cdi_dir, DIR_MODE)
        except OSError as exc:
            raise CdiError(f"cannot create CDI folder {self.cdi_dir}: {exc.strerror}") from exc

    def _move_aside(self, path: Path, found: _Stamp) -> Path:
        """Move what is at ``path`` (no regular file) to ``<name>.moved-aside-<n>``, and say so."""
        what = _kind(found.mode)
        for n in range(1, 1000):
            aside = path.with_name(f"{path.name}{MOVED_ASIDE}{n}")
            if _stat(aside) is not None:
                continue
            try:
                os.rename(path, aside)
            except FileNotFoundError:
                return aside  # gone by itself
            except OSError as exc:
                raise CdiError(f"{what} is in the way of {path} and cannot be moved: {exc.strerror}") from exc
            log.warning("%s was in the way of %s; moved aside to %s", what, path, aside.name)
            return aside
        raise CdiError(f"{what} is in the way of {path}, and 999 others were moved aside already")


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
    except (FileNotFoundError, NotADirectoryError):  # gone, or the folder itself is no folder
        return None
    except OSError as exc:
        raise CdiError(f"cannot stat CDI spec {path}: {exc.strerror}") from exc


def _read(path: Path, limit: int) -> bytes | None:
    """The regular file at ``path`` (never through a symlink), if it holds at most ``limit`` bytes."""
    try:
        return read_bounded(path, limit, "CDI spec", follow=False)
    except InputError:
        return None


def _kind(mode: int) -> str:
    if stat_module.S_ISDIR(mode):
        return "a folder"
    if stat_module.S_ISLNK(mode):
        return "a symlink"
    if stat_module.S_ISFIFO(mode):
        return "a FIFO"
    if stat_module.S_ISSOCK(mode):
        return "a socket"
    if stat_module.S_ISREG(mode):
        return "a file"
    return "a device node"
