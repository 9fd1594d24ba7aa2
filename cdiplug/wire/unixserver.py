"""A grpc.aio server on a unix socket the way the kubelet's folders need it: :class:`UnixServer`.

Both front ends serve this way (the device-plugin socket per resource; the DRA registration and
plugin sockets per driver). :meth:`UnixServer.start` refuses a socket a live process answers on
(a second cdiplug) and replaces a stale one. It binds inside a private folder of its own, made
beside the target (same file system) with mode 0700 whatever the umask
(``.cdiplug-<hash of the name>-<random>``), narrows the socket to 0600 while it is still in
there, renames it into place and removes the folder. So nobody else can connect to the socket
before it is 0600 (connecting needs search permission on every folder of the path: a process
watching the folder with inotify finds a folder it cannot enter), the kubelet's plugin watcher
never sees a half-made socket, and grpc, which unlinks the path it bound when it stops, unlinks
a name in a folder that is gone, never a socket someone else bound at our name later (a
restarted kubelet wipes the folder; another plugin may take the name). The folder's name has a
fixed length (a long socket name does not make the bound path longer), and is the same for one
socket name, so a folder a crash left behind is removed at the next start (only folders of that
pattern, owned by us, with nobody serving in them). :meth:`UnixServer.stop` removes the socket
only if it is still the one it bound.

The boundary: sockets and the server's life; the caller adds the services.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import logging
import os
import re
import socket
import stat
from collections.abc import Callable
from pathlib import Path

import grpc
import grpc.aio

from cdiplug.errors import SocketInUse

log = logging.getLogger(__name__)

SOCKET_MODE = 0o600
MAX_PATH = 107  # sun_path holds 108 bytes with the terminating NUL
# How long a live-socket probe may take: a process that accepts connections answers at once.
PROBE_TIMEOUT = 0.5

PRIVATE_MODE = 0o700
# Inside the private folder the socket is bound as "s": with ".cdiplug-" + 8 + "-" + 8 random
# characters the bound path is 28 bytes longer than the folder's, within the 30 that config.py
# allows for the temporary name.
_BOUND_NAME = "s"
_NAME_TRIES = 100  # random private folder names tried before giving up


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
        await _remove_leftovers(self.path)
        server = grpc.aio.server()
        self.add(server)
        private: Path | None = None
        try:
            private = _private_folder(self.path)
            bound = private / _BOUND_NAME
            if len(str(bound).encode()) > MAX_PATH:
                raise SocketInUse(f"{self.path.parent} is too long for cdiplug's temporary socket path {bound}")
            if server.add_insecure_port(f"unix://{bound}") == 0:
                raise SocketInUse(f"cannot bind a socket in {private}")
            os.chmod(bound, SOCKET_MODE)
            inner = bound.lstat()
            os.rename(bound, self.path)
            st = self.path.lstat()
            if (st.st_dev, st.st_ino) != (inner.st_dev, inner.st_ino):  # the folder was swapped under us
                raise SocketInUse(f"{self.path} is not the socket cdiplug bound; refusing to serve on it")
            private.rmdir()
            private = None
            await server.start()
        except OSError as exc:
            await _discard(server, private)
            raise SocketInUse(f"cannot serve on {self.path}: {exc.strerror or exc}") from exc
        except BaseException:
            await _discard(server, private)
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


def _prefix(path: Path) -> str:
    """The private folders' name up to the random part: one per socket name, a fixed length."""
    return f".cdiplug-{hashlib.sha256(path.name.encode()).hexdigest()[:8]}-"


def _private_folder(path: Path) -> Path:
    """A new folder beside ``path`` that only we may enter (0700 whatever the umask)."""
    # Not tempfile.mkdtemp: importing tempfile brings shutil, bz2 and lzma, 0.5 MiB of every start.
    for _ in range(_NAME_TRIES):
        folder = path.parent / (_prefix(path) + os.urandom(4).hex())
        try:
            folder.mkdir(mode=PRIVATE_MODE)
        except FileExistsError:
            continue
        os.chmod(folder, PRIVATE_MODE)  # mkdir's mode less the umask: an odd umask could leave it unwritable
        return folder
    raise FileExistsError(errno.EEXIST, f"no free private folder name beside {path}")


async def _remove_leftovers(path: Path) -> None:
    """Remove private folders of ``path``'s name that a crash left behind (ours only)."""
    pattern = re.compile(re.escape(_prefix(path)) + r"[a-z0-9_]{8}")
    try:
        names = [n for n in os.listdir(path.parent) if pattern.fullmatch(n)]
    except OSError:
        return
    for name in names:
        folder = path.parent / name
        try:
            st = folder.lstat()
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
                continue  # not a folder, or not ours: leave it be
            bound = folder / _BOUND_NAME
            if bound.is_socket() and await socket_is_live(bound):
                continue  # another cdiplug is starting on this name right now
            bound.unlink(missing_ok=True)
            folder.rmdir()
        except (OSError, SocketInUse) as exc:
            log.warning("cannot remove %s, left over from an earlier start: %s", folder, getattr(exc, "strerror", None) or exc)
            continue
        log.info("removed %s, left over from an earlier start", folder)


async def _discard(server: grpc.aio.Server, private: Path | None) -> None:
    await server.stop(None)
    if private is not None:
        try:
            (private / _BOUND_NAME).unlink(missing_ok=True)
            private.rmdir()
        except OSError:
            pass
