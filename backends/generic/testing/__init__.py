"""Fakes for testing the generic backend without the hardware (``.tree``).

- :class:`FakeDev`: device nodes (``mknod``), files and symlinks under a test folder's ``dev/``.
- :class:`UsbTree`: a fake USB sysfs tree whose devices plug and unplug with their nodes.
- :class:`FakeUdevMonitor`: the SDK's started pyudev-like monitor, fed by the test.
"""

from __future__ import annotations

from cdiplug.sdk import FakeUdevMonitor, UdevEvent

from .tree import USB_MAJOR, ClassNode, FakeDev, UsbTree

__all__ = ["USB_MAJOR", "ClassNode", "FakeDev", "FakeUdevMonitor", "UdevEvent", "UsbTree"]
