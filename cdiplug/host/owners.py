"""Which instance serves which resource on this node: one claim file per resource and DRA driver.

Several cdiplug instances may share a node (:mod:`cdiplug.models.instance`). Sockets, DRA device
metadata and node labels are named by resource or DRA driver, not by instance, so two instances
serving one resource would take each other's sockets over and fight over its files. Each instance
therefore claims what it serves in ``<state-dir>/owners/`` (shared by all instances):
``resource.<name>.lock`` and ``dra-driver.<driver>.lock`` (the name %-quoted: ``/`` never leaves
the folder), holding a shared ``flock`` on each for as long as it serves it, with its instance
name, process ID and pod UID written inside. The kernel drops the lock when the process dies,
however it dies, so a claim nobody holds is free and the next claimer writes its own name.

A claim is taken under an exclusive lock on ``owners/.guard.lock`` (held for a moment, with a
deadline): there, an exclusive ``flock`` that succeeds means nobody holds the name, and the
claimer writes itself in and keeps a shared lock; one that fails means somebody does, and the
file says who. The same instance again (the old and the new pod of a rolling update, each with
its own ``--pod-uid``) shares the claim; anyone else gets :class:`OwnerConflict`, naming the
owner, unless the newcomer runs with a pod UID of its own (the new pod of a surging rolling
update; the old one may have none): one instance with two processes serving one resource
otherwise is a mistake too. Claim files are never removed while the daemon runs (a removal could race with another
claimer opening the file); ``cdiplug cleanup`` removes those nobody holds.

Blocking calls (file operations, the short guard wait): call them through ``asyncio.to_thread``.
"""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import quote

from cdiplug.errors import ConfigError
from cdiplug.models.instance import DRA_DRIVER, RESOURCE, Instance, owners_dir
from cdiplug.toolkit import filelock

log = logging.getLogger(__name__)

GUARD = ".guard.lock"
GUARD_WAIT = 10.0  # seconds another instance may hold the guard (it does for a moment)
CONTENT_LIMIT = 4096
_WHAT = {RESOURCE: "resource", DRA_DRIVER: "DRA driver"}


class OwnerConflict(ConfigError):
    """Another instance on this node serves a resource (or DRA driver) this one is configured to serve."""


def claim_file(state_dir: Path, kind: str, name: str) -> Path:
    """``<state-dir>/owners/resource.example.com%2Ffpga.lock``."""
    return owners_dir(state_dir) / f"{kind}.{quote(name, safe='.-_')}.lock"


def read_owner(path: Path) -> dict[str, object]:
    """What the claim file says about its owner ({} when unreadable; never through a symlink)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return {}
    try:
        data = os.read(fd, CONTENT_LIMIT)
    except OSError:
        return {}
    finally:
        os.close(fd)
    import json  # only when another instance holds a claim: json is not needed to start serving

    try:
        value = json.loads(data)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def describe(owner: dict[str, object]) -> str:
    instance = owner.get("instance")
    name = Instance(instance).label if isinstance(instance, str) else "another cdiplug instance"
    details = [f"{k} {owner[k]}" for k in ("pid", "pod_uid") if owner.get(k)]
    return name + (f" ({', '.join(details)})" if details else "")


class Owners:
    """This instance's claims (blocking methods: call them from a thread)."""

    def __init__(self, state_dir: Path, instance: str = "", pod_uid: str | None = None) -> None:
        self.state_dir = Path(state_dir)
        self.instance = instance
        self.pod_uid = pod_uid
        self._held: dict[tuple[str, str], int] = {}  # (kind, name) -> the file descriptor holding it

    @property
    def held(self) -> set[tuple[str, str]]:
        return set(self._held)

    def claim(self, wanted: Iterable[tuple[str, str]]) -> None:
        """Hold every (kind, name) of ``wanted`` not held yet: all of them, or none of the new ones
        and OwnerConflict naming the instance that serves one already."""
        new = [w for w in dict.fromkeys(wanted) if w not in self._held]
        if not new:
            return
        taken: list[tuple[str, str]] = []
        with filelock.locked(owners_dir(self.state_dir) / GUARD, "the resource claims of this node", wait=GUARD_WAIT):
            try:
                for kind, name in new:
                    self._held[(kind, name)] = self._take(kind, name)
                    taken.append((kind, name))
            except BaseException:
                self.release(taken)
                raise

    def _take(self, kind: str, name: str) -> int:
        path = claim_file(self.state_dir, kind, name)
        try:
            fd = filelock.hold(path, f"the claim on {_WHAT[kind]} {name}", wait=0)
        except filelock.LockBusy:
            owner = read_owner(path)
            # The new pod of a surging rolling update has a pod UID; the old one may have none (a
            # DaemonSet moving from a device-plugin configuration to a DRA one surges from a pod
            # that never needed one).
            surge = bool(self.pod_uid) and owner.get("pod_uid") != self.pod_uid
            if owner.get("instance") != self.instance or not surge:
                raise OwnerConflict(
                    f"{_WHAT[kind]} {name} is served on this node by {describe(owner)} already ({path}); "
                    f"serve it from one cdiplug instance only (this is {Instance(self.instance).label})"
                ) from None
            return filelock.hold(path, f"the claim on {_WHAT[kind]} {name}", wait=0, shared=True)  # our other pod
        import json  # as above

        try:
            content = {"instance": self.instance, "pid": os.getpid(), "pod_uid": self.pod_uid or "", kind: name}
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(content).encode() + b"\n", 0)
            # Shared from now on, so that another pod of this instance may share it. Not atomic
            # (the lock is dropped, then taken shared), but every claimer holds the guard.
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BaseException:
            os.close(fd)
            raise
        log.debug("claimed %s %s for %s", _WHAT[kind], name, Instance(self.instance).label)
        return fd

    def release(self, names: Iterable[tuple[str, str]]) -> None:
        """Let go of these claims (another instance may serve them from now on)."""
        for key in list(names):
            fd = self._held.pop(key, None)
            if fd is not None:
                os.close(fd)

    def keep_only(self, wanted: Iterable[tuple[str, str]]) -> None:
        keep = set(wanted)
        self.release([k for k in self._held if k not in keep])

    def close(self) -> None:
        self.release(list(self._held))
