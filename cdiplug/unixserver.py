"""A grpc.aio server on a unix socket the way the kubelet's folders need it: :class:`UnixServer`.

Both front ends serve this way (the device-plugin socket per resource; the DRA registration and
plugin sockets per driver). :meth:`UnixServer.start` refuses a socket a live process answers on
(a second cdiplug) and replaces a stale one, binds a temporary name in the same folder, narrows it
to 0600 and renames it into place: the socket never appears with wider permissions, the
kubelet's plugin watcher never sees a half-made one, and grpc, which unlinks the path it bound
when it stops, can never remove a socket someone else bound at our name later (a restarted
kubelet wipes the folder; another plugin may take the name). :meth:`UnixServer.stop` removes the
socket only if it is still the one it bound.

The boundary: sockets and the server's life; the caller adds the services.
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
import grpc.aio

from .errors import SocketInUse

log = logging.getLogger(__name__)

SOCKET_MODE = 0o600
MAX_PATH = 107  # sun_path holds 108 bytes with the terminating NUL
# How long a live-socket probe may take: a process that accepts connections answers at once.
PROBE_TIMEOUT = 0.5

_temp_names = itertools.count()  # unique temporary socket names within this process


async def socket_is_live(path: Path, timeout: float = PROBE_TIMEOUT) -> bool:
    """Whether some process accepts connections on the unix socket at ``path``."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        await asyncio.wait_for(asyncio.get_running_loop().sock_connect(sock, str(path)), timeout)
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except TimeoutError:
        return True  # a full backlog: somebody listens, just slowly
    except OSError as exc:
        if exc.errno in (errno.ECONNREFUSED, errno.ENOENT, errno.ENOTSOCK):
            return False
        raise SocketInUse(f"cannot probe socket {path}: {exc.strerror}") from exc
    finally:
        sock.close()
    return True


async def clear_stale_socket(path: Path) -> None:
    """Remove a socket nobody answers on; refuse when a live process does or it is no socket."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise SocketInUse(f"{path} exists and is not a socket; refusing to replace it")
    if await socket_is_live(path):
        raise SocketInUse(f"another process is serving on {path}; is a second cdiplug running?")
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise SocketInUse(f"cannot remove stale socket {path}: {exc.strerror}") from exc
    log.info("removed stale socket %s", path)


class UnixServer:
    """One grpc.aio server on ``path``; ``add`` adds its services to each new grpc server.

    ``start()`` makes a new grpc server each time (a stopped one cannot start again), so a server
    whose socket was removed serves again after ``stop()`` and ``start()``.
    """

    def __init__(self, path: Path, add: Callable[[grpc.aio.Server], None], *, folder_mode: int = 0o750) -> None:
        self.path = Path(path)
        self.add = add
        self.folder_mode = folder_mode
        self._server: grpc.aio.Server | None = None
        self._inode: tuple[int, int, int] | None = None

    @property
    def serving(self) -> bool:
        return self._server is not None

    def present(self) -> bool:
        """Whether our socket file is still where we bound it (a kubelet restart wipes the folder)."""
        try:
            st = self.path.lstat()
        except OSError:
            return False
        # ctime too: a new socket may get the inode number of one just removed.
        return (st.st_dev, st.st_ino, st.st_ctime_ns) == self._inode

    async def start(self) -> None:
        if self._server is not None:
            return
        if len(str(self.path).encode()) > MAX_PATH:
            raise SocketInUse(f"{self.path} is too long for a unix socket path ({MAX_PATH} bytes at most)")
        try:
            self.path.parent.mkdir(mode=self.folder_mode, parents=True, exist_ok=True)
        except OSError as exc:
            raise SocketInUse(f"cannot create {self.path.parent}: {exc.strerror}") from exc
        await clear_stale_socket(self.path)
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
            await _discard(server, temp)
            raise SocketInUse(f"cannot serve on {self.path}: {exc.strerror or exc}") from exc
        except BaseException:
            await _discard(server, temp)
            raise
        self._inode = (st.st_dev, st.st_ino, st.st_ctime_ns)
        self._server = server

    async def stop(self, grace: float | None = 0.2) -> None:
        """Stop serving and remove our socket, only if it is still ours."""
        server, self._server = self._server, None
        if server is None:
            return
        await server.stop(grace)
        if self.present():  # never remove a socket somebody else bound at our name
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass
        self._inode = None


async def _discard(server: grpc.aio.Server, temp: Path) -> None:
    await server.stop(None)
    try:
        temp.unlink()
    except OSError:
        pass
