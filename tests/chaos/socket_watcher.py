"""The attacker of the socket race test, run as a non-root user: watches a folder with inotify
(ctypes on libc's inotify_init1/inotify_add_watch) and connects to every socket that appears in it,
as fast as it can, keeping whatever connection it gets.

For a name that appears it retries until the name is gone or refuses it for good (a temporary
socket renamed away; one narrowed to 0600); for a folder it retries ``FOLDER/NAME/s`` (where
cdiplug binds) until the folder is gone, and watches the folder too where it may. A regular file
``mark-N`` the test creates is answered with ``seen mark-N`` on stdout once every event before it
was handled; ``done`` ends the run with one JSON line: ``connections`` (how many connects
succeeded, with the paths) and ``attempts``.

Usage: ``python socket_watcher.py FOLDER UID``, started as root: it becomes ``UID`` (group the
same, no other groups, hence no capabilities) before it looks at anything, and says ``ready UID
CAPS`` (its effective capabilities, from /proc) once it watches.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import socket
import struct
import sys
import time

IN_CREATE, IN_MOVED_TO, IN_ISDIR = 0x100, 0x80, 0x40000000
EVENT = struct.Struct("iIII")
RETRY_FOR = 0.2  # seconds to keep trying one path (cdiplug's start takes milliseconds)

libc = ctypes.CDLL(None, use_errno=True)
attempts = 0
connected: list[str] = []
held: list[socket.socket] = []


def try_connect(path: str, gone: tuple[int, ...]) -> None:
    """Connect to ``path`` until it works, or fails with an errno in ``gone``, or time is up."""
    global attempts
    deadline = time.monotonic() + RETRY_FOR
    while time.monotonic() < deadline:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(1)
        attempts += 1
        try:
            sock.connect(path)
        except OSError as exc:
            sock.close()
            if exc.errno in gone:
                return
            continue
        connected.append(path)
        held.append(sock)  # a held connection keeps working after a chmod
        return


def main() -> None:
    folder, uid = sys.argv[1], int(sys.argv[2])
    # The interpreter may live where only root can read (a venv's pyenv Python under /root): it
    # starts as root and drops to the user here, before it touches anything of the test's.
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    fd = libc.inotify_init1(os.O_CLOEXEC)
    if fd < 0 or libc.inotify_add_watch(fd, folder.encode(), IN_CREATE | IN_MOVED_TO) < 0:
        raise OSError(ctypes.get_errno(), f"inotify on {folder}")
    watched = {folder}
    paths: dict[int, str] = {}
    with open("/proc/self/status") as status:
        caps = next(line.split()[1] for line in status if line.startswith("CapEff:"))
    print(f"ready {os.getuid()} {caps}", flush=True)
    while True:
        data = os.read(fd, 65536)
        offset = 0
        while offset < len(data):
            wd, mask, _cookie, size = EVENT.unpack_from(data, offset)
            name = data[offset + EVENT.size : offset + EVENT.size + size].rstrip(b"\0").decode()
            offset += EVENT.size + size
            parent = paths.get(wd, folder)
            path = os.path.join(parent, name)
            if parent == folder and name.startswith("mark-"):
                print(f"seen {name}", flush=True)
            elif parent == folder and name == "done":
                print(json.dumps({"connections": len(connected), "paths": connected, "attempts": attempts}), flush=True)
                return
            elif mask & IN_ISDIR:
                sub = libc.inotify_add_watch(fd, path.encode(), IN_CREATE | IN_MOVED_TO)
                if sub >= 0 and path not in watched:
                    paths[sub] = path
                    watched.add(path)
                # EACCES while the folder is there (it is 0700), ENOENT once it is gone.
                try_connect(os.path.join(path, "s"), (errno.ENOENT, errno.ENOTDIR))
            else:
                # EACCES: narrowed to 0600 already; ENOENT: renamed or removed.
                try_connect(path, (errno.ENOENT, errno.EACCES))


if __name__ == "__main__":
    main()
