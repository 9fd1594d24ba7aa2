"""What a resource's groups match now: devices found, and what each path and selector matched.

- A ``paths`` group is one device: every node its paths match, together (a sound card is its
  nodes). Its ID comes from its first path (``/dev/fuse`` -> ``fuse``, ``/dev/snd/*`` -> ``snd``),
  or ``group-<n>`` where that is taken. A path that matches nothing keeps the group from being a
  device unless it is ``optional``.
- A ``usb`` group gives one device per USB device that any of its selectors matches: its raw
  usbfs node and its class nodes (``usb``). The ID is ``usb-<vendor>-<product>-<serial>``, or
  ``usb-<vendor>-<product>-port-<port path>`` where the device has no serial; never bus and
  device numbers, which change on every replug.
- A node two groups match goes to the first; the second is skipped, saying so.

Nodes are read with ``stat`` (:mod:`.nodes`), so devices carry their type, major and minor.
Blocking: the backend calls :func:`scan` in a thread.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from attrs import frozen

from cdiplug.sdk import AttributeValue, ContainerEdits, DeviceNode, Mount

from .nodes import DevRoot, NodeInfo
from .options import GenericOptions, Group, PathEntry, PathType, UsbSelector
from .usb import UsbDevice
from .usb import scan as scan_usb

_ID_CHARS = re.compile(r"[^A-Za-z0-9_.-]+")


@frozen
class Found:
    """One device a group matches now (before slots and health)."""

    id: str
    group: int
    edits: ContainerEdits
    attributes: tuple[tuple[str, AttributeValue], ...] = ()

    @property
    def numbers(self) -> tuple[tuple[str, int | None, int | None], ...]:
        """Each node's container path, major and minor: what a replug changes."""
        return tuple((n.path, n.major, n.minor) for n in self.edits.device_nodes)


@frozen
class Scan:
    """One resource's scan: devices found, groups or devices skipped, and what each selector matched."""

    found: tuple[Found, ...]
    skipped: tuple[tuple[str, str], ...]
    explained: tuple[tuple[str, str], ...]


def clean_id(text: str) -> str:
    return _ID_CHARS.sub("_", text).strip("_.-")[:200]


def group_id(index: int, group: Group, taken: set[str]) -> str:
    first = group.paths[0].path.removeprefix("/dev/")
    stem = clean_id(re.sub(r"[*?\[].*$", "", first).rstrip("/").replace("/", "-"))
    name = stem if stem and stem not in taken else f"group-{index}"
    taken.add(name)
    return name


def usb_id(device: UsbDevice) -> str:
    if device.serial:
        return clean_id(f"usb-{device.vendor}-{device.product}-{device.serial}")
    return clean_id(f"usb-{device.vendor}-{device.product}-port-{device.port}")


def node_entry(info: NodeInfo, container: str, entry: PathEntry | None) -> DeviceNode | Mount:
    """A matched path as the container gets it: a device node (its real node, symlinks resolved;
    type, major, minor) or, for ``type: mount``, a bind mount. Host paths are node paths
    (``/dev/ttyUSB0``), as the runtime on the node sees them, whatever ``--dev-root`` cdiplug reads
    them under."""
    if entry is not None and entry.type is PathType.MOUNT:
        return Mount(host_path=info.real, container_path=container, read_only=entry.read_only)
    return DeviceNode(
        path=container,
        host_path=info.real,
        permissions=entry.permissions if entry is not None else "rwm",
        type=info.type,
        major=info.major,
        minor=info.minor,
    )


def _container_path(entry: PathEntry, path: str, matches: int) -> str:
    if entry.mount_path is None:
        return path
    if matches > 1 or entry.mount_path.endswith("/"):
        return entry.mount_path.rstrip("/") + "/" + Path(path).name  # a glob's nodes keep their names in that folder
    return entry.mount_path


def _edits(parts: Iterable[DeviceNode | Mount]) -> ContainerEdits:
    parts = list(parts)
    return ContainerEdits(
        device_nodes=[p for p in parts if isinstance(p, DeviceNode)],
        mounts=[p for p in parts if isinstance(p, Mount)],
    )


def _paths_group(index: int, group: Group, dev: DevRoot, claimed: dict[str, str], taken: set[str], out: _Out) -> None:
    at = f"groups[{index}]"
    parts: list[DeviceNode | Mount] = []
    missing: list[str] = []
    clash: list[str] = []
    for j, entry in enumerate(group.paths):
        where = f"{at}.paths[{j}] {entry.path}"
        matches = dev.glob(entry.path)
        infos = [(m, info) for m in matches if (info := dev.stat(m)) is not None]
        notes = []
        if entry.type is PathType.DEVICE:
            for m, info in infos:
                if info.type is None:
                    notes.append(f"{m} is no device node (type: mount bind-mounts files)")
            infos = [(m, i) for m, i in infos if i.type is not None]
        if entry.limit and len(infos) > entry.limit:
            notes.append(f"limit {entry.limit}: left out {', '.join(m for m, _ in infos[entry.limit :])}")
            infos = infos[: entry.limit]
        for _, info in infos:
            owner = claimed.setdefault(info.real, at)
            if owner != at:
                clash.append(f"{info.real} is claimed by {owner} too")
        if infos:
            described = ", ".join(f"{m} ({_describe(i)})" for m, i in infos)
            out.explained.append((where, f"matched {described}" + (f"; {'; '.join(notes)}" if notes else "")))
        else:
            out.explained.append(
                (
                    where,
                    "matched nothing" + (" (optional)" if entry.optional else "") + (f"; {'; '.join(notes)}" if notes else ""),
                )
            )
            if not entry.optional:
                missing.append(entry.path)
        parts.extend(node_entry(info, _container_path(entry, m, len(infos)), entry) for m, info in infos)
    device_id = group_id(index, group, taken)
    if missing:
        out.skipped.append((device_id, f"{at}: {', '.join(missing)} matched nothing"))
    elif clash:
        out.skipped.append((device_id, f"{at}: {'; '.join(clash)}"))
    else:
        attributes: tuple[tuple[str, AttributeValue], ...] = (("nodes", len(parts)), ("group", index))
        out.found.append(Found(device_id, index, _edits(parts), attributes))


def _describe(info: NodeInfo) -> str:
    if info.type is None:
        return "a file"
    link = f" -> {info.real}" if info.real != info.path else ""
    return f"{info.type} {info.major}:{info.minor}{link}"


def usb_matches(selector: UsbSelector, device: UsbDevice) -> bool:
    return (
        fnmatch.fnmatchcase(device.vendor, selector.vendor.lower())
        and (selector.product is None or fnmatch.fnmatchcase(device.product, selector.product.lower()))
        and (selector.serial is None or (device.serial is not None and fnmatch.fnmatchcase(device.serial, selector.serial)))
    )


def usb_attributes(device: UsbDevice, index: int) -> tuple[tuple[str, AttributeValue], ...]:
    attributes: list[tuple[str, AttributeValue]] = [
        ("vendor", device.vendor),
        ("product", device.product),
        ("serial", device.serial or ""),
        ("manufacturer", device.manufacturer or ""),
        ("productName", device.product_name or ""),
        ("port", device.port),
        ("class", device.device_class),
        ("nodeClasses", ",".join(device.classes)),
        ("group", index),
    ]
    return tuple(attributes)


def _usb_group(index: int, group: Group, devices: Sequence[UsbDevice], claimed: dict[str, str], out: _Out) -> None:
    at = f"groups[{index}]"
    for j, selector in enumerate(group.usb):
        where = f"{at}.usb[{j}] {selector.vendor}:{selector.product or '*'}" + (
            f" serial {selector.serial}" if selector.serial else ""
        )
        hits = [d for d in devices if usb_matches(selector, d)]
        near = [
            d
            for d in devices
            if d not in hits
            and d.vendor == selector.vendor.lower()
            and (selector.product is None or d.product == selector.product.lower())
        ]
        text = ", ".join(
            f"{d.vendor}:{d.product} serial {d.serial or '-'} at port {d.port} ({', '.join(n.path for n in d.nodes) or 'no nodes'})"
            for d in hits
        )
        if near:
            text += (
                ("; " if text else "") + "other serials: " + ", ".join(f"{d.serial or '(none)'} at port {d.port}" for d in near)
            )
        out.explained.append((where, f"matched {text}" if hits else "matched nothing" + (f"; {text}" if text else "")))
    for device in devices:
        if not any(usb_matches(s, device) for s in group.usb):
            continue
        device_id = usb_id(device)
        owners = {n.path: claimed.setdefault(n.path, at) for n in device.nodes}
        taken = sorted({o for o in owners.values() if o != at})
        if taken:
            out.skipped.append((device_id, f"{at}: its nodes are claimed by {', '.join(taken)} too"))
            continue
        parts = [
            node_entry(NodeInfo(n.path, n.path, "b" if n.cls == "block" else "c", n.major, n.minor), n.path, None)
            for n in device.nodes
        ]
        out.found.append(Found(device_id, index, _edits(parts), usb_attributes(device, index)))


class _Out:
    def __init__(self) -> None:
        self.found: list[Found] = []
        self.skipped: list[tuple[str, str]] = []
        self.explained: list[tuple[str, str]] = []


def scan(options: GenericOptions, dev: DevRoot, sysfs: Path, usb: Sequence[UsbDevice] | None = None) -> Scan:
    """Match ``options``' groups against the host now (``usb``: USB devices already read, else read here)."""
    out = _Out()
    claimed: dict[str, str] = {}
    taken: set[str] = set()
    devices = list(usb if usb is not None else (scan_usb(sysfs) if any(g.usb for g in options.groups) else ()))
    seen: set[str] = set()
    for index, group in enumerate(options.groups):
        if group.paths:
            _paths_group(index, group, dev, claimed, taken, out)
        else:
            _usb_group(index, group, devices, claimed, out)
    unique = []
    for found in out.found:
        if found.id in seen:
            out.skipped.append((found.id, f"groups[{found.group}]: the same device as an earlier group's"))
            continue
        seen.add(found.id)
        unique.append(found)
    return Scan(tuple(unique), tuple(out.skipped), tuple(out.explained))
