"""Fakes for testing code on the PCI backend without the hardware (``.sysfs``).

- :class:`SysfsTree`: lays out fake sysfs trees of PCI functions (IOMMU groups, SR-IOV, netdevs,
  block devices) and their ``/dev/vfio`` nodes, as Linux does.
- :class:`FakeSysfsKernel`: the kernel's side of binding (``driver_override``, ``bind``,
  ``drivers_probe``), recording writes, failing or "crashing" (:class:`SimulatedCrash`) on cue.
- :class:`FakeUdevMonitor`: a started pyudev monitor that the fake kernel feeds.
"""

from __future__ import annotations

from .sysfs import FakeSysfsKernel, FakeUdevMonitor, SimulatedCrash, SysfsTree, UdevEvent

__all__ = ["FakeSysfsKernel", "FakeUdevMonitor", "SimulatedCrash", "SysfsTree", "UdevEvent"]
