"""Atomic file replacement: readers see the old content or the new, never half of either.

The one way cdiplug writes files others read or that must survive a crash (CDI specs, the PCI
journal): a temporary file beside the target (``.<name>.<pid>.<thread>.tmp``, so leftovers of a
crash are recognisable), the mode set explicitly (the umask may have narrowed it), every byte
written, fsync, rename over the target, fsync of the folder. OS errors propagate as ``OSError``
for the caller to map into its own error; the temporary file never outlives a failure.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

TEMP_SUFFIX = ".tmp"


def temp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}{TEMP_SUFFIX}")


def write_atomic(path: Path, data: bytes, mode: int, *, durable: bool = True) -> os.stat_result:
    """Replace ``path`` with ``data`` (file mode ``mode``); returns the new file's ``fstat``.

    ``durable=False`` skips the fsyncs: the rename is still atomic for any process that dies (the
    kernel has the data); only a power loss may find the old content.
    """
    temp = temp_name(path)
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, mode)
        try:
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if durable:
                os.fsync(fd)
            stat = os.fstat(fd)
        finally:
            os.close(fd)
        os.rename(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    if durable:
        fsync_dir(path.parent)
    return stat


def fsync_dir(folder: Path) -> None:
    """Make a rename or unlink in ``folder`` durable. Best effort: some filesystems refuse it."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def make_dirs(folder: Path, mode: int) -> None:
    """Create ``folder`` and its missing parents with exactly ``mode``, whatever the umask.

    Folders that exist are left as they are. Raises ``OSError``.
    """
    missing: list[Path] = []
    while not folder.is_dir() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    for path in reversed(missing):
        try:
            path.mkdir(mode=mode)
        except FileExistsError:
            continue
        os.chmod(path, mode)  # mkdir's mode went through the umask
