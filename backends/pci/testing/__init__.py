"""Fakes for testing code on the PCI backend without the hardware (``.sysfs``).

- :class:`SysfsTree`: lays out fake sysfs trees of PCI functions (IOMMU groups, SR-IOV, netdevs,
  block devices) and their ``/dev/vfio`` nodes, as Linux does.
- :class:`FakeSysfsKernel`: the kernel's side of binding (``driver_override``, ``bind``,
  ``drivers_probe``), recording writes, failing or "crashing" (:class:`SimulatedCrash`) on cue.
- :class:`FakeUdevMonitor`: the SDK's started pyudev-like monitor, which the fake kernel feeds.
"""

from __future__ import annotations

from cdiplug.sdk import FakeUdevMonitor, UdevEvent

from .sysfs import FakeSysfsKernel, SimulatedCrash, SysfsTree

__all__ = ["FakeSysfsKernel", "FakeUdevMonitor", "SimulatedCrash", "SysfsTree", "UdevEvent"]
