"""Bounded reading of the files cdiplug is given: configuration, health files, state records, kubeconfigs.

Whoever can write such a file (an operator, a ConfigMap, a crashed earlier run, an attacker with
a foothold) must not be able to hang the daemon or exhaust its memory through it. So
:func:`read_bounded`:

- opens with ``O_NONBLOCK`` (a FIFO without a writer does not block the open) and, for files in
  our own state folder, ``O_NOFOLLOW`` (a symlink planted there is refused, not followed);
- accepts only a regular file (``fstat`` after the open, so the check and the read see the same
  file): a FIFO, a device such as ``/dev/zero``, a socket or a folder is a clear error;
- reads at most ``limit + 1`` bytes: a longer file is an error naming the limit, never a
  ``MemoryError``.

:func:`decode_text` turns the bytes into text, strictly UTF-8. Every error is an
:class:`~cdiplug.errors.InputError` naming the file. Limits: :data:`CONFIG_LIMIT` (1 MiB) for
configuration, health files and kubeconfigs, :data:`STATE_LIMIT` (64 KiB) for state records.
Parsing is ``cdiplug.toolkit.safeload``'s; writing is ``cdiplug.toolkit.atomic``'s.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from cdiplug.errors import InputError

CONFIG_LIMIT = 1 << 20  # configuration, fake health files, kubeconfigs
STATE_LIMIT = 64 << 10  # journal entries and bound records (a few hundred bytes each)

_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _kind(mode: int) -> str:
    for test, name in _KINDS:
        if test(mode):
            return name
    return "not a regular file"


def read_bounded(path: Path | str, limit: int, what: str, *, follow: bool = True, missing_ok: bool = False) -> bytes | None:
    """The bytes of the regular file ``path``, at most ``limit`` of them.

    ``what`` says what the file is for the message (``configuration``, ``health file``).
    ``follow=False`` refuses a symlink at ``path`` itself. ``missing_ok``: None when there is no
    file. Raises :class:`InputError` for anything else that is wrong.
    """
    source = str(path)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        if missing_ok:
            return None
        raise InputError(f"cannot read {what}: No such file or directory", "$", source) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow:
            raise InputError(f"cannot read {what}: it is a symbolic link", "$", source) from exc
        raise InputError(f"cannot read {what}: {exc.strerror or exc}", "$", source) from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"cannot read {what}: it is {_kind(st.st_mode)}, not a regular file", "$", source)
        # st_size is not trusted either way: sysfs attributes say 4096, /proc files 0, and a file
        # may grow after fstat. Reading stops at limit + 1 bytes.
        chunks: list[bytes] = []
        size = 0
        while size <= limit:  # the size may change after fstat: read no more than limit + 1
            chunk = os.read(fd, limit + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise InputError(f"{what} is too big: more than {limit:,} bytes", "$", source)
        return b"".join(chunks)
    except OSError as exc:
        raise InputError(f"cannot read {what}: {exc.strerror or exc}", "$", source) from exc
    finally:
        os.close(fd)


def decode_text(data: bytes, source: str, what: str = "file") -> str:
    """``data`` as UTF-8 text; an :class:`InputError` naming the first bad byte otherwise."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise InputError(f"not UTF-8 text (byte {exc.start} is 0x{data[exc.start]:02x}, on line {line})", "$", source) from None


def read_text(path: Path | str, limit: int, what: str, *, follow: bool = True, missing_ok: bool = False) -> str | None:
    """:func:`read_bounded` and :func:`decode_text` in one."""
    data = read_bounded(path, limit, what, follow=follow, missing_ok=missing_ok)
    if data is None:
        return None
    return decode_text(data, str(path), what)
