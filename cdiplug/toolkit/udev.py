"""Device events from udev, read on the event loop, and a fake monitor for tests.

:class:`UdevWatch` takes a pyudev-like monitor (``fileno()``, ``poll(timeout)``, optional
``start()``): a backend's own (tests pass :class:`FakeUdevMonitor`), else a netlink monitor opened
by :func:`open_monitor` when ``--sysfs-root`` is a real sysfs (udev's own events where udevd runs,
the kernel's otherwise). The descriptor is read through ``loop.add_reader``; nothing polls. Each
batch is a list of :class:`UdevEvent` — add, remove, bind, unbind, change — of the subsystems
asked for (all when none are named).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Collection
from pathlib import Path
from typing import Protocol

from attrs import frozen

log = logging.getLogger(__name__)

UDEV_CONTROL = Path("/run/udev/control")


class UdevDevice(Protocol):
    """What the watch reads of an event (pyudev's ``Device``); ``subsystem`` and ``device_node``
    are read when present."""

    @property
    def action(self) -> object: ...

    @property
    def sys_name(self) -> object: ...


class UdevMonitor(Protocol):
    """A pyudev-like monitor; ``start()`` and ``close()`` are used when present."""

    def fileno(self) -> int: ...

    def poll(self, timeout: float | None = None) -> UdevDevice | None: ...


@frozen
class UdevEvent:
    """One event as a backend sees it: ``action``, the device's ``sys_name`` (a PCI address,
    ``ttyUSB0``, ``1-1.4``), its ``subsystem`` and, for a device with a node, ``device_node``."""

    action: str
    sys_name: str
    subsystem: str = ""
    device_node: str | None = None


def open_monitor(sysfs_root: Path, subsystems: Collection[str] = ()) -> UdevMonitor | None:
    """A pyudev netlink monitor of ``subsystems`` (all when empty), or None where no events can
    come (a fake sysfs tree) or no monitor can be opened (the caller's periodic rescan then does)."""
    if not (Path(sysfs_root) / "kernel" / "uevent_seqnum").exists():
        return None  # not a real sysfs: nothing will send events about it
    try:
        import pyudev

        source = "udev" if UDEV_CONTROL.exists() else "kernel"
        netlink = pyudev.Monitor.from_netlink(pyudev.Context(), source=source)
        for subsystem in sorted(subsystems):
            netlink.filter_by(subsystem)
        monitor: UdevMonitor = netlink  # pyudev is untyped: typed from here on
        return monitor
    except (ImportError, OSError) as exc:
        log.warning("no udev monitor (%s): relying on the periodic rescan", exc)
        return None


def close_monitor(monitor: UdevMonitor) -> None:
    close = getattr(monitor, "close", None)
    if close is not None:
        close()


class UdevWatch:
    """Batches of events from one monitor, as an async iterator (``subsystems``: those kept; all when empty)."""

    def __init__(self, monitor: UdevMonitor, subsystems: Collection[str] = ()) -> None:
        self.monitor = monitor
        self.subsystems = frozenset(subsystems)
        self._pending: list[UdevEvent] = []
        self._event = asyncio.Event()

    def _on_readable(self) -> None:
        while True:
            try:
                event = self.monitor.poll(timeout=0)
            except OSError as exc:
                log.warning("reading a udev event failed: %s", exc)
                break
            if event is None:
                break
            subsystem = str(getattr(event, "subsystem", "") or "")
            if not self.subsystems or subsystem in self.subsystems:
                node = getattr(event, "device_node", None)
                self._pending.append(UdevEvent(str(event.action), str(event.sys_name), subsystem, str(node) if node else None))
        if self._pending:
            self._event.set()

    async def batches(self) -> AsyncIterator[list[UdevEvent]]:
        start = getattr(self.monitor, "start", None)
        if start is not None:
            start()
        loop = asyncio.get_running_loop()
        fd = self.monitor.fileno()
        loop.add_reader(fd, self._on_readable)
        try:
            while True:
                await self._event.wait()
                self._event.clear()
                batch, self._pending = self._pending, []
                yield batch
        finally:
            loop.remove_reader(fd)


class FakeUdevMonitor:
    """A started pyudev-like monitor for tests: ``fileno()`` becomes readable when events are
    queued with :meth:`emit`, ``poll(0)`` reads one."""

    def __init__(self) -> None:
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        self._events: list[UdevEvent] = []
        self.started = False

    def start(self) -> None:
        self.started = True

    def fileno(self) -> int:
        return self._r

    def emit(self, action: str, sys_name: str, subsystem: str = "pci", device_node: str | None = None) -> None:
        self._events.append(UdevEvent(action, sys_name, subsystem, device_node))
        os.write(self._w, b"x")

    def poll(self, timeout: float | None = None) -> UdevEvent | None:
        try:
            os.read(self._r, 1)
        except BlockingIOError:
            return None
        return self._events.pop(0) if self._events else None

    def close(self) -> None:
        for fd in (self._r, self._w):
            try:
                os.close(fd)
            except OSError:
                pass
