"""Which cdiplug instances of this node are alive: each holds a lock file for as long as it runs.

During a rolling update (``--pod-uid``, ``maxSurge: 1``) the old and the new daemon share the
claim checkpoint. A claim the old one is preparing is recorded ``PrepareStarted`` with its owner,
and the new one's start-up rollback (:func:`~cdiplug.dra.rollback.roll_back_started`) must leave it
to its owner while the owner lives. Each instance holds ``fcntl.flock`` on
``<state-dir>/dra-instances/<pod uid>.lock`` from start to stop; the kernel drops the lock when
the process dies, however it dies, so a file nobody holds is an instance that is gone. The IDs are
pod UIDs, checked by :func:`~cdiplug.models.world.pod_uid_problem` before they name a file.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from cdiplug.models.world import pod_uid_problem
from cdiplug.toolkit import filelock

log = logging.getLogger(__name__)

FOLDER = "dra-instances"


def _path(state_dir: Path, instance: str) -> Path:
    problem = pod_uid_problem(instance)
    if problem is not None:
        raise ValueError(f"instance {instance!r}: {problem}")
    return Path(state_dir) / FOLDER / f"{instance}.lock"


class InstanceLock:
    """This instance's lock (blocking calls: file operations only, no waiting)."""

    def __init__(self, state_dir: Path, instance: str) -> None:
        self.state_dir = Path(state_dir)
        self.instance = instance
        self.path = _path(self.state_dir, instance)
        self._fd: int | None = None

    def acquire(self) -> None:
        """Hold the lock; StateFileError when another process of the same pod UID holds it (or it cannot be made)."""
        self._fd = filelock.hold(self.path, f"the instance lock of {self.instance}", wait=0)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            self.path.unlink(missing_ok=True)

    def alive(self, instance: str) -> bool:
        """Whether the instance ``instance`` runs now: this one, or one whose lock is held."""
        if instance == self.instance:
            return True
        try:
            path = _path(self.state_dir, instance)
        except ValueError:
            return False  # no pod UID: no instance of ours
        if filelock.is_held(path):
            return True
        log.debug("instance %s left no lock held behind: it is gone", instance)
        return False
