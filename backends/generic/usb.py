"""USB devices from sysfs, each with every device node that belongs to it.

A USB device is ``<sysfs>/bus/usb/devices/<port path>`` (``1-1.4``; root hubs ``usbN`` are left
out) holding ``idVendor``, ``idProduct``, ``serial``, ``manufacturer``, ``product``, ``busnum``,
``devnum``, ``bDeviceClass`` and its raw usbfs node (``uevent``'s ``DEVNAME``,
``bus/usb/BBB/DDD``). Its class nodes are found the other way round: every device of the classes
in :data:`CLASSES` (``<sysfs>/class/<class>/<name>``, with a ``dev`` file) is followed to its real
sysfs folder and up its parents to the first folder that is a USB device. Blocking: call in a thread.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path

from attrs import frozen

CLASSES = ("tty", "hidraw", "input", "video4linux", "sound", "block", "usbmisc")


@frozen
class UsbNode:
    """A device node of a USB device: ``name`` under ``/dev`` (``ttyUSB0``, ``input/event3``)."""

    cls: str
    name: str
    major: int
    minor: int

    @property
    def path(self) -> str:
        return f"/dev/{self.name}"


@frozen
class UsbDevice:
    """One USB device as sysfs shows it now; ``nodes`` are its raw node first, then its class nodes."""

    port: str
    vendor: str
    product: str
    serial: str | None
    manufacturer: str | None
    product_name: str | None
    busnum: int
    devnum: int
    device_class: str
    nodes: tuple[UsbNode, ...]

    @property
    def classes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(n.cls for n in self.nodes[1:]))


def _read(folder: Path, name: str) -> str | None:
    try:
        return (folder / name).read_text(errors="replace").strip()
    except OSError:
        return None


def _uevent(folder: Path) -> Mapping[str, str]:
    text = _read(folder, "uevent") or ""
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def _dev(folder: Path) -> tuple[int, int] | None:
    text = _read(folder, "dev")
    if text is None or ":" not in text:
        return None
    major, _, minor = text.partition(":")
    try:
        return int(major), int(minor)
    except ValueError:
        return None


def class_nodes(sysfs: Path, usb_devices: set[str]) -> dict[str, list[UsbNode]]:
    """Class nodes by the real sysfs folder of the USB device they belong to (one of ``usb_devices``,
    real folders): each class device's real folder is followed up, by its path alone, to the first
    of them."""
    found: dict[str, list[UsbNode]] = {}
    for cls in CLASSES:
        try:
            entries = sorted(os.listdir(sysfs / "class" / cls))
        except OSError:
            continue
        for name in entries:
            link = sysfs / "class" / cls / name
            real = os.path.realpath(link)
            parent = os.path.dirname(real)
            while parent not in usb_devices and len(parent) > 1:
                parent = os.path.dirname(parent)
            if parent not in usb_devices:
                continue  # not on USB (most ttys, the node's own disks)
            number = _dev(link)
            if number is None:
                continue
            devname = _uevent(link).get("DEVNAME", name)
            found.setdefault(parent, []).append(UsbNode(cls, devname, *number))
    return found


def scan(sysfs: Path) -> Iterator[UsbDevice]:
    """Every USB device (root hubs left out), in port order."""
    root = sysfs / "bus" / "usb" / "devices"
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return
    names = [n for n in names if ":" not in n and not n.startswith("usb")]  # not interfaces, not root hubs
    real = {name: os.path.realpath(root / name) for name in names}
    nodes = class_nodes(sysfs, set(real.values()))
    for name in names:
        folder = root / name
        vendor, product = _read(folder, "idVendor"), _read(folder, "idProduct")
        busnum, devnum = _read(folder, "busnum"), _read(folder, "devnum")
        if not (vendor and product and busnum and devnum and busnum.isdigit() and devnum.isdigit()):
            continue
        raw = _dev(folder)
        devname = _uevent(folder).get("DEVNAME", f"bus/usb/{int(busnum):03d}/{int(devnum):03d}")
        own = [UsbNode("usb", devname, *raw)] if raw is not None else []
        yield UsbDevice(
            port=name,
            vendor=vendor.lower(),
            product=product.lower(),
            serial=_read(folder, "serial") or None,
            manufacturer=_read(folder, "manufacturer"),
            product_name=_read(folder, "product"),
            busnum=int(busnum),
            devnum=int(devnum),
            device_class=(_read(folder, "bDeviceClass") or "00").lower(),
            nodes=(*own, *nodes.get(real[name], [])),
        )
