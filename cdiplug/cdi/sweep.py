"""Removing stale files of cdiplug's from the CDI folder: the one sweep both spec owners use.

The per-resource specs (:meth:`cdiplug.cdi.writer.SpecWriter.remove_stale`: kinds no longer
served, temporary files a crash left) and the DRA front end's per-claim specs
(:func:`cdiplug.dra.claimspec.remove_stale`: claims its checkpoint does not know) each say which
names are stale; :func:`sweep` lists the folder once and removes exactly those that are regular
files, never following a symlink, never a folder or anyone else's file. Blocking: call it through
``asyncio.to_thread``.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

from cdiplug.errors import CdiError


def sweep(cdi_dir: Path | str, stale: Callable[[str], bool]) -> list[Path]:
    """Remove the regular files of ``cdi_dir`` whose name ``stale`` accepts; the paths removed, sorted.

    A missing folder has nothing stale; a folder that cannot be listed, or a file that cannot be
    removed, is a CdiError naming it. A file gone meanwhile is not counted.
    """
    try:
        entries = list(os.scandir(cdi_dir))
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise CdiError(f"cannot list CDI folder {cdi_dir}: {exc.strerror}") from exc
    removed: list[Path] = []
    for entry in entries:
        if not stale(entry.name) or not entry.is_file(follow_symlinks=False):
            continue
        if unlink(Path(entry.path)):
            removed.append(Path(entry.path))
    return sorted(removed)


def unlink(path: Path) -> bool:
    """Remove the file ``path``; False when it is gone or was replaced by a folder meanwhile (not
    ours to remove), a CdiError naming it when it cannot be removed."""
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False
    except OSError as exc:
        if exc.errno == errno.EISDIR:
            return False
        raise CdiError(f"cannot remove {path}: {exc.strerror}") from exc
