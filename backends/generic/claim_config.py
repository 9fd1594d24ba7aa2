"""The generic backend's per-claim configuration (DRA opaque parameters, ``kind: GenericConfig``).

::

    apiVersion: cdiplug.dev/v1alpha1
    kind: GenericConfig
    container_paths: {/dev/ttyUSB0: /dev/modem}   # where a node of the device shows in the container
    permissions: r          # cgroup access to the device's nodes: some of r, w, m
    file_mode: 0o660        # the nodes' mode in the container (an int; YAML 0660 is octal too)
    uid: 1000               # and their owner
    gid: 20

All optional. A ``container_paths`` key is a node path of the device as advertised (globs match
several: the value is then a folder, the nodes keep their names in it); a key that matches no node
of a device is an error of that claim, so a typo cannot go unnoticed.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterator
from pathlib import PurePosixPath

from attrs import evolve, field, frozen

from cdiplug.sdk import CheckedOptions, Configured, Device, DeviceNode, InvalidRequest

KIND = "GenericConfig"
MAX_PATHS = 64
_PERMISSIONS = re.compile(r"[rwm]{1,3}")


@frozen
class GenericClaimConfig(CheckedOptions):
    container_paths: dict[str, str] = field(factory=dict)
    permissions: str | None = None
    file_mode: int | None = None
    uid: int | None = None
    gid: int | None = None

    def problems(self) -> Iterator[tuple[str, str]]:
        if len(self.container_paths) > MAX_PATHS:
            yield "container_paths", f"has {len(self.container_paths)} entries, more than {MAX_PATHS}"
        for key, value in self.container_paths.items():
            for what, path in (("key", key), ("value", value)):
                pure = PurePosixPath(path)
                if not pure.is_absolute() or ".." in pure.parts or "\x00" in path:
                    yield f"container_paths.{key}", f"the {what} must be an absolute path without '..', got {path[:200]!r}"
        if self.permissions is not None and (
            not _PERMISSIONS.fullmatch(self.permissions) or len(set(self.permissions)) != len(self.permissions)
        ):
            yield "permissions", f"expected some of r, w and m, got {self.permissions!r}"
        if self.file_mode is not None and not 0 <= self.file_mode <= 0o7777:
            yield "file_mode", f"expected a mode from 0 to 0o7777, got {self.file_mode}"
        for name in ("uid", "gid"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < 2**32:
                yield name, f"expected a number from 0 to 4294967295, got {value}"


def _place(node: DeviceNode, config: GenericClaimConfig, used: set[str]) -> DeviceNode:
    path = node.path
    for key, target in config.container_paths.items():
        if fnmatch.fnmatchcase(node.path, key):
            used.add(key)
            path = target if key == node.path else target.rstrip("/") + "/" + PurePosixPath(node.path).name
            break
    return evolve(
        node,
        path=path,
        host_path=node.host_path or node.path,
        permissions=config.permissions or node.permissions,
        file_mode=config.file_mode if config.file_mode is not None else node.file_mode,
        uid=config.uid if config.uid is not None else node.uid,
        gid=config.gid if config.gid is not None else node.gid,
    )


def configure(device: Device, config: GenericClaimConfig) -> Configured:
    used: set[str] = set()
    nodes = tuple(_place(n, config, used) for n in device.edits.device_nodes)
    unused = sorted(set(config.container_paths) - used)
    if unused:
        have = ", ".join(n.path for n in device.edits.device_nodes) or "none"
        raise InvalidRequest(f"{device.id} has no node {unused[0]} (its nodes: {have}) @ $.parameters.container_paths")
    return Configured(evolve(device, edits=evolve(device.edits, device_nodes=nodes)))
