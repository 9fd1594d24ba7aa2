"""A fake ``/dev`` and a fake USB sysfs tree, laid out as Linux does, for tests of the generic backend.

:class:`FakeDev` makes device nodes under a test folder's ``dev/`` with ``mknod`` (the tests run
as root, as the daemon does; elsewhere a plain file stands in, which the backend treats as no
device node). :class:`UsbTree` plugs and unplugs USB devices: ``bus/usb/devices/<port>`` links to
``devices/pci0000:00/0000:00:14.0/usb<bus>/<port>`` holding ``idVendor``, ``idProduct``,
``serial``, ``manufacturer``, ``product``, ``busnum``, ``devnum``, ``bDeviceClass``, ``dev`` and
``uevent``; each class node sits below the device's first interface
(``<port>:1.0/<name>/<class>/<name>``) with ``dev`` and ``uevent``, linked from
``class/<class>/<name>``; the raw usbfs node and the class nodes appear under the fake ``/dev``.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Sequence
from pathlib import Path

from attrs import frozen

USB_MAJOR = 189


class FakeDev:
    """Device nodes under ``<root>/dev`` (``root`` is the world's ``dev_root``)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        (self.root / "dev").mkdir(parents=True, exist_ok=True)

    def host(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    def node(self, path: str, major: int, minor: int, kind: str = "c", mode: int = 0o666) -> Path:
        """Make (or remake, with new numbers) the node ``path`` (``/dev/ttyUSB0``)."""
        host = self.host(path)
        host.parent.mkdir(parents=True, exist_ok=True)
        if host.exists() or host.is_symlink():
            host.unlink()
        flag = stat.S_IFCHR if kind == "c" else stat.S_IFBLK
        try:
            os.mknod(host, mode | flag, os.makedev(major, minor))
        except PermissionError:
            host.write_text(f"{kind} {major}:{minor}\n")
        return host

    def file(self, path: str, text: str = "") -> Path:
        host = self.host(path)
        host.parent.mkdir(parents=True, exist_ok=True)
        host.write_text(text)
        return host

    def link(self, path: str, target: str) -> Path:
        """A symlink ``path`` -> ``target`` (both node paths), relative as udev makes them."""
        host = self.host(path)
        host.parent.mkdir(parents=True, exist_ok=True)
        if host.is_symlink() or host.exists():
            host.unlink()
        host.symlink_to(os.path.relpath(self.host(target), host.parent))
        return host

    def remove(self, path: str) -> None:
        host = self.host(path)
        if host.is_symlink() or host.exists():
            host.unlink()


@frozen
class ClassNode:
    """A class node of a fake USB device: class (``tty``), name under /dev (``ttyUSB0``), numbers."""

    cls: str
    name: str
    major: int
    minor: int


class UsbTree:
    """Fake USB devices in a sysfs tree at ``sysfs`` with their nodes in ``dev``."""

    def __init__(self, sysfs: Path, dev: FakeDev) -> None:
        self.sysfs = Path(sysfs)
        self.dev = dev
        self.controller = self.sysfs / "devices" / "pci0000:00" / "0000:00:14.0"
        (self.sysfs / "bus" / "usb" / "devices").mkdir(parents=True, exist_ok=True)
        (self.sysfs / "class").mkdir(parents=True, exist_ok=True)
        self._nodes: dict[str, list[str]] = {}
        self._links: dict[str, list[Path]] = {}

    def plug(
        self,
        port: str,
        vendor: str,
        product: str,
        *,
        serial: str | None = None,
        manufacturer: str = "Fake",
        product_name: str = "Fake USB device",
        devnum: int = 2,
        device_class: str = "00",
        nodes: Sequence[ClassNode] = (),
    ) -> None:
        """Plug a device in at ``port`` (``1-1``: bus 1), with its raw node ``189:<(bus-1)*128+devnum-1>``."""
        bus = int(port.split("-", 1)[0])
        folder = self.controller / f"usb{bus}" / port
        folder.mkdir(parents=True, exist_ok=True)
        devname = f"bus/usb/{bus:03d}/{devnum:03d}"
        minor = (bus - 1) * 128 + devnum - 1
        files = {
            "idVendor": vendor,
            "idProduct": product,
            "manufacturer": manufacturer,
            "product": product_name,
            "busnum": str(bus),
            "devnum": str(devnum),
            "bDeviceClass": device_class,
            "dev": f"{USB_MAJOR}:{minor}",
            "uevent": f"MAJOR={USB_MAJOR}\nMINOR={minor}\nDEVNAME={devname}\nDEVTYPE=usb_device\n",
        }
        if serial is not None:
            files["serial"] = serial
        for name, text in files.items():
            (folder / name).write_text(text + "\n")
        links = [self._link(self.sysfs / "bus" / "usb" / "devices" / port, folder)]
        self.dev.node(f"/dev/{devname}", USB_MAJOR, minor)
        paths = [f"/dev/{devname}"]
        for node in nodes:
            base = node.name.rsplit("/", 1)[-1]
            where = folder / f"{port}:1.0" / base / node.cls / base
            where.mkdir(parents=True, exist_ok=True)
            (where / "dev").write_text(f"{node.major}:{node.minor}\n")
            (where / "uevent").write_text(f"MAJOR={node.major}\nMINOR={node.minor}\nDEVNAME={node.name}\n")
            links.append(self._link(self.sysfs / "class" / node.cls / base, where))
            self.dev.node(f"/dev/{node.name}", node.major, node.minor, "b" if node.cls == "block" else "c")
            paths.append(f"/dev/{node.name}")
        self._nodes[port] = paths
        self._links[port] = links

    def unplug(self, port: str) -> None:
        """What the kernel and devtmpfs do on an unplug: folders, links and nodes go."""
        bus = int(port.split("-", 1)[0])
        for link in self._links.pop(port, []):
            if link.is_symlink():
                link.unlink()
        shutil.rmtree(self.controller / f"usb{bus}" / port, ignore_errors=True)
        for path in self._nodes.pop(port, []):
            self.dev.remove(path)

    @staticmethod
    def _link(link: Path, target: Path) -> Path:
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink():
            link.unlink()
        link.symlink_to(os.path.relpath(target, link.parent))
        return link
