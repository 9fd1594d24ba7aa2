"""The generic backend: device nodes by path or glob, and USB devices by vendor, product and serial.

Options: :mod:`cdiplug_backends.generic.options` (``groups`` of ``paths`` or ``usb``, with
``count``); what a group matches: :mod:`.discovery`; hotplug and health: :mod:`.backend`;
per-claim configuration (DRA, ``kind: GenericConfig``): :mod:`.claim_config`. Fakes for tests (a
``/dev`` folder, a USB sysfs tree, a udev monitor): :mod:`cdiplug_backends.generic.testing`.
"""

from __future__ import annotations

import functools

from cdiplug.sdk import BackendPlugin, UdevMonitor

from .backend import GenericBackend
from .options import GenericOptions, Group, PathEntry, PathType, UsbSelector


def make_plugin(udev_monitor: UdevMonitor | None = None) -> BackendPlugin[GenericOptions]:
    """The plugin, with a pyudev-like monitor of your own (None: the real one where udev exists)."""
    return BackendPlugin(
        name="generic", options_type=GenericOptions, create=functools.partial(GenericBackend, udev_monitor=udev_monitor)
    )


plugin = make_plugin()

__all__ = ["GenericBackend", "GenericOptions", "Group", "PathEntry", "PathType", "UsbSelector", "make_plugin", "plugin"]
