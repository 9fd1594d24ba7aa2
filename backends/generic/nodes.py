"""Device nodes and files under ``/dev`` as the host has them: globbing, stat, symlinks.

Paths are node paths (``/dev/ttyUSB0``); the host sees them under the world's ``dev_root``.
A node is read with ``stat`` (following a symlink): its type (``c``/``b``), major and minor go
into the CDI spec, so a symlink host path (``/dev/serial/by-id/...``) works too (the CDI library
reads a host node with ``lstat`` and refuses a symlink without them). Blocking: call in a thread.
"""

from __future__ import annotations

import glob
import os
import stat
from pathlib import Path, PurePosixPath

from attrs import frozen


@frozen
class NodeInfo:
    """What a path is on the host now: ``real`` is the node path after symlinks (``/dev/ttyUSB0``)."""

    path: str
    real: str
    type: str | None  # "c", "b", or None for an ordinary file or folder
    major: int | None = None
    minor: int | None = None

    @property
    def number(self) -> tuple[str | None, int | None, int | None]:
        return self.type, self.major, self.minor


class DevRoot:
    """Node paths as seen under ``root`` (``/`` in production, a test folder in tests)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._prefix = str(self.root).rstrip("/")

    def host(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    def node_path(self, host: str) -> str:
        """``<root>/dev/x`` -> ``/dev/x``."""
        rest = host[len(self._prefix) :] if self._prefix and host.startswith(self._prefix) else host
        return "/" + rest.lstrip("/")

    def glob(self, pattern: str) -> list[str]:
        """Node paths matching ``pattern`` (a literal path: itself when it exists), sorted."""
        host = str(self.host(pattern))
        matches = glob.glob(glob.escape(str(self.root).rstrip("/")) + "/" + pattern.lstrip("/"))
        if not matches and os.path.lexists(host):
            matches = [host]
        return sorted(self.node_path(m) for m in matches)

    def stat(self, path: str) -> NodeInfo | None:
        """The node behind ``path`` now; None when it is gone (or a dangling link)."""
        host = self.host(path)
        try:
            st = os.lstat(host)
            if stat.S_ISLNK(st.st_mode):  # a link (by-id, by-path): its real node
                st = os.stat(host)
                real = self.node_path(os.path.realpath(host))
            else:
                real = path  # the node itself (folders under /dev are folders, not links)
        except OSError:
            return None
        if PurePosixPath(real).parts[1:2] != ("dev",):
            return None  # a link out of /dev: not ours to hand out
        if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
            kind = "c" if stat.S_ISCHR(st.st_mode) else "b"
            return NodeInfo(path, real, kind, os.major(st.st_rdev), os.minor(st.st_rdev))
        return NodeInfo(path, real, None)
