"""A grpc.aio server on a unix socket the way the kubelet's plugin folders need it.

:class:`UnixServer` refuses a socket a live process answers on (a second cdiplug), replaces a
stale one, binds a temporary name narrowed to 0600 and renames it into place (the kubelet's
plugin watcher never sees a half-made socket), and removes the socket when it stops, but only
if it is still the one it bound.

The boundary: sockets and the server's life; the services are added by the caller.
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import logging
import os
import socket
import stat
from collections.abc import Callable
from pathlib import Path

import grpc

from ..errors import SocketInUse

log = logging.getLogger(__name__)

SOCKET_MODE = 0o600
MAX_PATH = 107
_temp_names = itertools.count()


def _probe(path: Path) -> bool:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(0.5)
    try:
        sock.connect(str(path))
    except OSError as exc:
        if exc.errno in (errno.ECONNREFUSED, errno.ENOENT):
            return False
        raise SocketInUse(f"cannot probe socket {path}: {exc.strerror}") from exc
    finally:
        sock.close()
    return True


async def clear_stale(path: Path) -> None:
    """Remove a socket nobody serves on; SocketInUse when someone does or it is no socket."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise SocketInUse(f"{path} exists and is not a socket; refusing to replace it")
    if await asyncio.to_thread(_probe, path):
        raise SocketInUse(f"another process is serving on {path}; is a second cdiplug running?")
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise SocketInUse(f"cannot remove stale socket {path}: {exc.strerror}") from exc


class UnixServer:
    """One grpc.aio server on ``path``; ``add`` adds its services before it starts."""

    def __init__(self, path: Path, add: Callable[[grpc.aio.Server], None]) -> None:
        self.path = Path(path)
        self.add = add
        self._server: grpc.aio.Server | None = None
        self._inode: tuple[int, int] | None = None

    @property
    def serving(self) -> bool:
        return self._server is not None

    async def start(self) -> None:
        if self._server is not None:
            return
        if len(str(self.path).encode()) > MAX_PATH:
            raise SocketInUse(f"{self.path} is too long for a unix socket path ({MAX_PATH} bytes at most)")
        try:
            self.path.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
        except OSError as exc:
            raise SocketInUse(f"cannot create {self.path.parent}: {exc.strerror}") from exc
        await clear_stale(self.path)
        temp = self.path.with_name(f".cdiplug-{os.getpid()}-{next(_temp_names)}.sock")
        server = grpc.aio.server()
        self.add(server)
        try:
            if server.add_insecure_port(f"unix://{temp}") == 0:
                raise SocketInUse(f"cannot bind a socket in {self.path.parent}")
            os.chmod(temp, SOCKET_MODE)
            os.rename(temp, self.path)
            st = self.path.lstat()
            await server.start()
        except OSError as exc:
            await server.stop(None)
            _unlink(temp)
            raise SocketInUse(f"cannot serve on {self.path}: {exc.strerror or exc}") from exc
        except BaseException:
            await server.stop(None)
            _unlink(temp)
            raise
        self._inode = (st.st_dev, st.st_ino)
        self._server = server

    async def stop(self, grace: float | None = 0.2) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        await server.stop(grace)
        try:
            st = self.path.lstat()
            if (st.st_dev, st.st_ino) == self._inode:
                self.path.unlink()
        except FileNotFoundError:
            pass
        self._inode = None


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass
