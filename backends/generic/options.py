"""The generic backend's per-resource options, as the config file spells them.

```yaml
options:
  groups:
    - paths:                         # one device: every node these paths match, together
        - {path: /dev/snd/*}         # a glob under /dev
        - {path: /dev/fuse, mount_path: /dev/fuse, permissions: rw, optional: true}
        - {path: /dev/shm/cache, type: mount, read_only: true}
      count: 10                      # how many containers may share the group at once
    - usb:                           # one device per USB device matching any entry
        - {vendor: "0403", product: "6001", serial: "FT*"}
  rescan_interval: 30                # seconds between rescans (udev events come at once)
  evict_unplugged: false             # DRA: an unplugged device's taint is NoExecute, not NoSchedule
```

The names follow squat/generic-device-plugin's, in snake case (``mountPath`` is ``mount_path``).
Only value checks live here (``problems()``); what a path or selector matches is ``discovery``'s.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterator
from pathlib import PurePosixPath

from attrs import frozen

from cdiplug.sdk import CheckedOptions, SizedOptions, register_enum

_USB_ID = re.compile(r"[0-9a-fA-F]{4}")
_USB_ID_GLOB = re.compile(r"[0-9a-fA-F*?\[\]!-]{1,16}")
_PERMISSIONS = re.compile(r"[rwm]{1,3}")
_GLOB = re.compile(r"[*?\[]")
MAX_GROUPS = 256
MAX_COUNT = 1000


class PathType(str, enum.Enum):
    """How a matched path reaches the container."""

    DEVICE = "device"  # a device node entry (the device cgroup allows it)
    MOUNT = "mount"  # a bind mount of an ordinary file or folder


register_enum(PathType)


def has_glob(path: str) -> bool:
    return _GLOB.search(path) is not None


@frozen
class PathEntry:
    """One path (or glob) of a group; ``limit``: at most that many of its matches (0: all)."""

    path: str  # a node under /dev, globs allowed (/dev/ttyS*); a symlink gives its real node
    mount_path: str | None = None  # the path in the container (default: the same); a folder for a glob's matches
    type: PathType = PathType.DEVICE  # device: a device node entry; mount: a bind mount of a file or folder
    permissions: str = "rwm"  # cgroup access to the node: some of r, w, m
    read_only: bool = False  # type: mount only: the bind mount is read-only
    optional: bool = False  # matching nothing does not keep the group from being a device
    limit: int = 0  # at most this many of the path's matches (0: all)

    def problems(self, at: str) -> Iterator[tuple[str, str]]:
        yield from _path_problems(f"{at}.path", self.path, under_dev=True)
        if self.mount_path is not None:
            yield from _path_problems(f"{at}.mount_path", self.mount_path, under_dev=False)
            if has_glob(self.mount_path):
                yield f"{at}.mount_path", f"a container path is no glob: {self.mount_path!r}"
        if not _PERMISSIONS.fullmatch(self.permissions) or len(set(self.permissions)) != len(self.permissions):
            yield f"{at}.permissions", f"expected some of r, w and m (such as rwm or r), got {self.permissions!r}"
        if self.read_only and self.type is PathType.DEVICE:
            yield f"{at}.read_only", "read_only applies to type: mount (a device node's access is its permissions)"
        if self.limit < 0:
            yield f"{at}.limit", f"must be 0 (all matches) or more, got {self.limit}"


def _path_problems(at: str, path: str, under_dev: bool) -> Iterator[tuple[str, str]]:
    pure = PurePosixPath(path)
    if not pure.is_absolute():
        yield at, f"expected an absolute path, got {path!r}"
    elif ".." in pure.parts:
        yield at, f"a path may not contain '..': {path!r}"
    elif under_dev and (len(pure.parts) < 3 or pure.parts[1] != "dev"):
        yield at, f"only paths under /dev are served, got {path!r}"
    elif "\x00" in path or "\n" in path:
        yield at, "a path may not contain NUL or newline characters"


@frozen
class UsbSelector:
    """USB devices by identity: ``vendor`` and ``product`` are 4 hex digits (or globs); ``serial``
    a string or glob (absent: any)."""

    vendor: str  # 4 hex digits, quoted ("0403"); globs allowed
    product: str | None = None  # 4 hex digits, quoted; globs allowed; absent: any
    serial: str | None = None  # the device's serial number or a glob; absent: any

    def problems(self, at: str) -> Iterator[tuple[str, str]]:
        for name, value in (("vendor", self.vendor), ("product", self.product)):
            if value is None:
                continue
            if value.lower().startswith("0x"):
                yield f"{at}.{name}", f'expected 4 hexadecimal digits without 0x (such as "{value[2:].zfill(4)}"), got {value!r}'
            elif has_glob(value) and _USB_ID_GLOB.fullmatch(value):
                continue
            elif not _USB_ID.fullmatch(value):
                yield (
                    f"{at}.{name}",
                    f'expected 4 hexadecimal digits such as "0403", got {value!r} '
                    "(quote the value: YAML reads 0403 as a number and 0x0403 as 1027)",
                )
        if self.serial is not None and not self.serial:
            yield f"{at}.serial", "an empty serial matches nothing: leave serial out to match any"


@frozen
class Group:
    """One group: ``paths`` (one device) or ``usb`` (one device per matching USB device)."""

    paths: tuple[PathEntry, ...] = ()  # one device: every node these paths match, together
    usb: tuple[UsbSelector, ...] = ()  # one device per USB device any selector matches, with its class nodes
    count: int = 1  # how many containers may share a device at once (DRA: the capacity "slots")

    def problems(self, at: str) -> Iterator[tuple[str, str]]:
        if bool(self.paths) == bool(self.usb):
            yield at, "a group has either paths or usb (one of them, not both)"
        if not 1 <= self.count <= MAX_COUNT:
            yield f"{at}.count", f"must be at least 1 and at most {MAX_COUNT}, got {self.count}"
        for i, entry in enumerate(self.paths):
            yield from entry.problems(f"{at}.paths[{i}]")
        if self.paths and all(e.optional for e in self.paths):
            yield f"{at}.paths", "at least one path of a group must not be optional"
        for i, selector in enumerate(self.usb):
            yield from selector.problems(f"{at}.usb[{i}]")


@frozen
class GenericOptions(CheckedOptions, SizedOptions):
    """Options of one resource served by the generic backend (see the module docstring)."""

    groups: tuple[Group, ...] = ()  # each group has either paths or usb
    rescan_interval: float = 30.0  # seconds between rescans, the safety net beside udev events
    evict_unplugged: bool = False  # DRA: an unplugged device's taint is NoExecute rather than NoSchedule

    def problems(self) -> Iterator[tuple[str, str]]:
        if not self.groups:
            yield "groups", "at least one group is needed"
        if len(self.groups) > MAX_GROUPS:
            yield "groups", f"has {len(self.groups)} groups, more than {MAX_GROUPS}"
        for i, group in enumerate(self.groups):
            yield from group.problems(f"groups[{i}]")
        yield from _same_node(self.groups)
        if not 0 < self.rescan_interval <= 86400:
            yield "rescan_interval", f"must be more than 0 and at most 86400 seconds, got {self.rescan_interval:g}"

    def device_estimate(self, resource: str) -> tuple[int, int]:
        slots = sum(g.count * (8 if g.usb else 1) for g in self.groups)
        return max(slots, 1), 64


def _same_node(groups: tuple[Group, ...]) -> Iterator[tuple[str, str]]:
    """Two groups naming the same literal path (globs are checked against the nodes they match, at discovery)."""
    seen: dict[str, str] = {}
    for i, group in enumerate(groups):
        for j, entry in enumerate(group.paths):
            if has_glob(entry.path):
                continue
            at = f"groups[{i}].paths[{j}].path"
            first = seen.setdefault(entry.path, at)
            if first != at and not first.startswith(f"groups[{i}]."):
                yield at, f"{entry.path} is claimed by two groups (first at {first})"
