"""The PCI backend: whole PCI functions and SR-IOV VFs from sysfs, optionally bound to vfio-pci.

Options: see :mod:`cdiplug_backends.pci.options`. Devices:

- ID: the PCI address (``0000:3b:02.0``); NUMA node from sysfs (``-1``: no topology);
  ``prepare_group``: the IOMMU group (VFIO mode).
- VFIO mode (``vfio: true``): each device's edits hold its group's node ``/dev/vfio/<group>``
  (``/dev/vfio/noiommu-<group>`` in no-IOMMU mode; plus ``/dev/vfio/devices/vfioN`` once bound where
  iommufd is present); the resource's common edits hold ``/dev/vfio/vfio`` (and ``/dev/iommu``
  where iommufd is present). Allocate binds the device's whole IOMMU group to vfio-pci first.
- Without VFIO each device carries ``PCI_DEVICE_<ADDRESS>=<address>`` (``PCI_DEVICE_0000_3B_02_0``).
- Every Allocate answer carries ``PCI_RESOURCE_<RESOURCE>`` with the comma-joined addresses of the
  allocated functions, the resource name upper-cased with every character other than a letter or
  digit turned into ``_`` — KubeVirt's convention, so ``example.com/nic-vfio`` gives
  ``PCI_RESOURCE_EXAMPLE_COM_NIC_VFIO=0000:3b:02.0,0000:3b:02.1``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from cdiplug.sdk import BackendPlugin, UdevMonitor, World

from .backend import PciBackend
from .options import PciOptions, Release, Selector


def make_plugin(udev_monitor: UdevMonitor | None = None, **backend_options: Any) -> BackendPlugin[PciOptions]:
    """The plugin, with a pyudev-like monitor of your own (None: the real one where udev exists)."""
    create = functools.partial(PciBackend, udev_monitor=udev_monitor, **backend_options)

    async def clean_up(world: World) -> Sequence[str]:
        return await PciBackend((), world, udev_monitor=udev_monitor, **backend_options).clean_up()

    return BackendPlugin(name="pci", options_type=PciOptions, create=create, clean_up=clean_up)


plugin = make_plugin()

__all__ = ["PciBackend", "PciOptions", "Release", "Selector", "make_plugin", "plugin"]
