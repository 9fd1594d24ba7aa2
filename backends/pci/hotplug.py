"""PCI hotplug and driver events from udev, read on the event loop.

:class:`UdevWatch` takes a pyudev-like monitor (``fileno()``, ``poll(timeout)``, optional
``start()``): ``world.udev_monitor`` when the world gives one (tests pass
``cdiplug_backends.pci.testing.FakeUdevMonitor``), else a netlink monitor of PCI devices opened by
:func:`open_monitor` when ``--sysfs-root`` is a real sysfs (udev's own events where udevd runs,
the kernel's otherwise). The descriptor is read through ``loop.add_reader``; nothing polls. Each
batch is a list of ``(action, address)`` — add, remove, bind, unbind, change.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Protocol

log = logging.getLogger(__name__)

UDEV_CONTROL = Path("/run/udev/control")


class UdevDevice(Protocol):
    """What the watch reads of an event (pyudev's ``Device``); ``subsystem`` is read when present."""

    @property
    def action(self) -> object: ...

    @property
    def sys_name(self) -> object: ...


class UdevMonitor(Protocol):
    """A pyudev-like monitor; ``start()`` and ``close()`` are used when present."""

    def fileno(self) -> int: ...

    def poll(self, timeout: float | None = None) -> UdevDevice | None: ...


def open_monitor(sysfs_root: Path) -> UdevMonitor | None:
    """A pyudev netlink monitor of PCI devices, or None where no events can come (a fake tree)."""
    if not (Path(sysfs_root) / "kernel" / "uevent_seqnum").exists():
        return None  # not a real sysfs: nothing will send events about it
    try:
        import pyudev

        source = "udev" if UDEV_CONTROL.exists() else "kernel"
        netlink = pyudev.Monitor.from_netlink(pyudev.Context(), source=source)
        netlink.filter_by("pci")
        monitor: UdevMonitor = netlink  # pyudev is untyped: typed from here on
        return monitor
    except (ImportError, OSError) as exc:
        log.warning("no udev monitor (%s): relying on the periodic rescan", exc)
        return None


class UdevWatch:
    """Batches of PCI events from one monitor, as an async iterator."""

    def __init__(self, monitor: UdevMonitor) -> None:
        self.monitor = monitor
        self._pending: list[tuple[str, str]] = []
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
            if getattr(event, "subsystem", "pci") == "pci":
                self._pending.append((str(event.action), str(event.sys_name)))
        if self._pending:
            self._event.set()

    async def batches(self) -> AsyncIterator[list[tuple[str, str]]]:
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
