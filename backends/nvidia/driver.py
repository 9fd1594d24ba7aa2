"""Optional driver mounts: the NVIDIA user-space files a container gets from a configured driver root.

Only when a resource sets ``driver_root`` (``/`` for a driver installed on the node,
``/run/nvidia/driver`` for the GPU operator's driver container). Each of ``driver_files`` (paths
relative to that root, shell globs allowed) that exists is bind-mounted read-only at the same
path inside the container. Files are looked up under ``--dev-root`` (where the node's ``/`` is
seen from cdiplug), and a match whose real path leaves the driver root (a symlink to elsewhere)
is refused, so configuration cannot mount arbitrary node files. Libraries mounted this way are
found by the container's loader only where its default paths cover them; runtimes that use the
NVIDIA container toolkit do not need this at all.
"""

from __future__ import annotations

import glob
import logging
import os
from pathlib import Path, PurePosixPath

from cdiplug.sdk import Mount, World

from .options import NvidiaOptions

log = logging.getLogger(__name__)


def driver_mounts(world: World, options: NvidiaOptions) -> tuple[Mount, ...]:
    """Read-only mounts for every configured driver file found (blocking: it reads the disk)."""
    if options.driver_root is None:
        return ()
    root_node = PurePosixPath(options.driver_root)  # as the node sees it
    root_seen = world.host_path(root_node)  # as cdiplug sees it
    try:
        root_real = Path(os.path.realpath(root_seen))
    except OSError:
        return ()
    mounts: dict[str, Mount] = {}
    for pattern in options.driver_files:
        for found in sorted(glob.glob(str(root_seen / pattern))):
            relative = PurePosixPath(os.path.relpath(found, root_seen))
            if ".." in relative.parts:
                continue
            real = Path(os.path.realpath(found))
            if not real.is_relative_to(root_real) or not real.is_file():
                log.warning("not mounting driver file %s: it resolves outside %s or is not a file", found, root_seen)
                continue
            container_path = "/" + str(relative)
            # Mount the file the symlink names at the symlink's path: the bind follows it anyway,
            # and naming the real file keeps the spec readable.
            host_path = str(root_node / real.relative_to(root_real))
            mounts.setdefault(container_path, Mount(host_path=host_path, container_path=container_path, read_only=True))
    if not mounts:
        log.warning("driver_root %s holds none of the configured driver files", root_node)
    return tuple(mounts.values())
