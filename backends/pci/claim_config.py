"""The PCI backend's per-claim configuration (DRA opaque parameters, ``kind: PciConfig``).

::

    apiVersion: cdiplug.dev/v1alpha1
    kind: PciConfig
    vfio: false       # this claim keeps the host driver: no bind, no /dev/vfio in its spec
    release: keep     # this claim's unprepare leaves its group on vfio-pci (the resource's: absent)

Both default to the resource's options. ``vfio: true`` binds the claim's IOMMU group to
vfio-pci as the resource does (safety checks included); ``vfio: false`` on a ``vfio: true``
resource leaves the function on its host driver: the spec gives ``PCI_DEVICE_<ADDRESS>`` as a
resource without VFIO does, nothing is bound, nothing released. What cannot be: ``vfio: true`` on
a resource without ``vfio`` (its functions were selected without the IOMMU checks), ``vfio: false``
for a function already on vfio-pci (left bound by ``release: keep``: it has no host driver to
keep), and ``release: restore`` on a resource whose release is ``keep`` (the backend restores
only what its resource allows). Each is an error of that claim's prepare. An admin-access
(monitoring) claim never gets the VFIO group node: the function's ``PCI_DEVICE_<ADDRESS>`` only.
"""

from __future__ import annotations

from collections.abc import Iterator

from attrs import evolve, frozen

from cdiplug.sdk import CheckedOptions, Configured, ContainerEdits, Device, InvalidRequest

from .discovery import device_env
from .options import PciOptions, Release
from .vfio import VFIO_DRIVER

KIND = "PciConfig"


@frozen
class PciClaimConfig(CheckedOptions):
    vfio: bool | None = None  # None: the resource's
    release: Release | None = None  # None: the resource's

    def problems(self) -> Iterator[tuple[str, str]]:
        if self.vfio is False and self.release is not None:
            yield "release", "release needs vfio: true (nothing is bound with vfio: false)"


def configure(resource: str, options: PciOptions, device: Device, config: PciClaimConfig) -> Configured:
    vfio = options.vfio if config.vfio is None else config.vfio
    if vfio and not options.vfio:
        raise InvalidRequest(f"vfio: true needs resource {resource} to have vfio: true @ $.parameters.vfio")
    if config.release is Release.RESTORE and options.release is not Release.RESTORE:
        raise InvalidRequest(f"release: restore needs resource {resource} to have release: restore @ $.parameters.release")
    if vfio:
        # keep: the claim's unprepare leaves the group bound; else the resource's release applies.
        return Configured(device, release=config.release is not Release.KEEP)
    if not options.vfio:
        return Configured(device)  # as the resource has it: nothing to bind
    if device.attribute("driver") == VFIO_DRIVER:
        raise InvalidRequest(
            f"{device.id} is on vfio-pci already (left bound by an earlier claim, release: keep): "
            "it has no host driver to keep @ $.parameters.vfio"
        )
    plain = ContainerEdits(env={device_env(device.id): device.id})
    return Configured(evolve(device, edits=plain), prepare=False, release=False, common_edits=False)


def admin_access(options: PciOptions, device: Device) -> Configured:
    """A device of an admin-access (monitoring) claim: never the VFIO group node, which would hand
    the container the device's DMA (and would not exist while the function is unbound): the
    function's address as a resource without VFIO gives it, no common edits."""
    if not options.vfio:
        return Configured(device, prepare=False, release=False)
    plain = ContainerEdits(env={device_env(device.id): device.id})
    return Configured(evolve(device, edits=plain), prepare=False, release=False, common_edits=False)
