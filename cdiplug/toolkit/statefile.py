"""cdiplug's own state files in ``--state-dir``: written whole, read bounded, set aside when unusable.

The one way the daemon keeps state across restarts (the DRA checkpoint, the PCI journal):

- :func:`write`: atomically (a temporary file beside the target, fsync, rename, fsync of the
  folder: :mod:`cdiplug.toolkit.atomic`; the fsyncs optional), mode 0600 (the state is the daemon's alone), the folder made
  0700 when missing;
- :func:`read`: at most ``limit`` bytes, never through a symlink at the path, never opening a
  FIFO, device or folder (``O_NOFOLLOW | O_NONBLOCK``, then ``fstat``: a regular file only);
- :func:`load`: read and parse; a file that cannot be read that way or parsed is *corrupt*:
  renamed to ``<name>.corrupt-<time>`` (a name never read again, kept for people to look at;
  ``<time>`` is UTC ``YYYYMMDDTHHMMSS`` plus a counter if that name exists) and the reason logged;
  the caller gets its default and goes on.

Errors that are the machine's (a folder that cannot be written) are :class:`StateFileError`.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from cdiplug.errors import CdiplugError, InputError
from cdiplug.toolkit.atomic import make_dirs, write_atomic
from cdiplug.toolkit.files import read_bounded
from cdiplug.toolkit.tally import STATE_FILES_SET_ASIDE

log = logging.getLogger(__name__)

FILE_MODE = 0o600
FOLDER_MODE = 0o700
CORRUPT_MARK = ".corrupt-"
REASON_LIMIT = 300  # characters of a reason in the log: a parser may quote what it read

T = TypeVar("T")


class StateFileError(CdiplugError):
    """A state file could not be written, or a corrupt one not moved aside."""


def write(path: Path, data: bytes, what: str, mode: int = FILE_MODE, *, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` atomically (blocking); StateFileError naming ``what``.

    ``durable=False`` skips the fsyncs: the rename is still atomic for any process that dies
    (the kernel has the data), only a power loss may find the old content. For records that
    matter only as long as the kernel's own state does (a claim's start, which guards a VFIO bind
    that a reboot undoes anyway).
    """
    try:
        if not path.parent.is_dir():
            make_dirs(path.parent, FOLDER_MODE)
        write_atomic(path, data, mode, durable=durable)
    except OSError as exc:
        raise StateFileError(f"cannot write {what} {path}: {exc.strerror or exc}") from exc


def read(path: Path, limit: int, what: str) -> bytes | None:
    """The bytes of ``path`` (blocking); None when missing; InputError when it is no file of ours."""
    return read_bounded(path, limit, what, follow=False, missing_ok=True)


def aside_name(path: Path) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    aside = path.with_name(f"{path.name}{CORRUPT_MARK}{stamp}")
    n = 1
    while os.path.lexists(aside):
        aside = path.with_name(f"{path.name}{CORRUPT_MARK}{stamp}.{n}")
        n += 1
    return aside


def set_aside(path: Path, reason: str, what: str) -> Path:
    """Rename ``path`` (whatever it is: a symlink is renamed, not followed) out of the way; logged."""
    aside = aside_name(path)
    why = reason if len(reason) <= REASON_LIMIT else reason[:REASON_LIMIT] + "…"
    try:
        os.rename(path, aside)
    except OSError as exc:
        raise StateFileError(f"{what} {path} is unreadable ({why}) and cannot be moved aside: {exc.strerror or exc}") from exc
    log.error("%s %s is unreadable (%s); moved aside to %s", what, path, why, aside.name)
    STATE_FILES_SET_ASIDE.add(what)
    return aside


def load(path: Path, limit: int, what: str, parse: Callable[[bytes], T], default: Callable[[], T]) -> T:
    """``parse(read(path))``; ``default()`` when missing, or when corrupt (then moved aside).

    ``parse`` raises ValueError (UnicodeDecodeError, json's errors), TypeError or InputError for
    content it refuses; anything else propagates.
    """
    try:
        data = read(path, limit, what)
        if data is None:
            return default()
        return parse(data)
    except (InputError, ValueError, TypeError) as exc:
        reason = exc.message if isinstance(exc, InputError) else str(exc) or type(exc).__name__
        set_aside(path, reason, what)
        return default()
