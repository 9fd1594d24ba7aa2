"""The PCI backend's per-claim configuration (cdiplug_backends.pci.claim_config, ``kind: PciConfig``).

The real PciBackend on a fake sysfs tree (with the fake kernel for binding); parameters go
through the DRA front end's real decoding (cdiplug.dra.claim_config). Covers: by default a claim
is prepared as the resource says (bound, released); ``vfio: false`` keeps the host driver: no
preparation, no release, no /dev/vfio node, the function's ``PCI_DEVICE_<ADDRESS>`` instead and no
common edits; ``release: keep`` leaves the group bound; what cannot be is an error naming the
field and the claim: ``vfio: true`` on a resource without VFIO, ``release: restore`` on a
``keep`` resource, ``release`` with ``vfio: false``, ``vfio: false`` for a function already on
vfio-pci, an unknown field; an admin-access claim gets the function's address, never the VFIO
group node.
"""

from __future__ import annotations

from typing import Any

import pytest

from cdiplug.dra import claim_config
from cdiplug.dra.claims import AllocatedClaim, AllocatedDevice, ClaimRef, ConfigEntry, ConfigSource
from cdiplug.errors import InvalidRequest
from cdiplug.models.world import World
from cdiplug_backends.pci.testing import FakeSysfsKernel, SysfsTree

from .conftest import add_nic_with_vfs, make_backend, running

VFIO = ("example.com/nic-vfio", {"selectors": [{"addresses": ["0000:3b:02.1"]}], "vfio": True, "release": "restore"})
VFIO_KEEP = ("example.com/nic-keep", {"selectors": [{"addresses": ["0000:3b:02.2"]}], "vfio": True})
PLAIN = ("example.com/nic", {"selectors": [{"addresses": ["0000:3b:02.3"]}]})
ADDRESSES = {"example.com/nic-vfio": "0000:3b:02.1", "example.com/nic-keep": "0000:3b:02.2", "example.com/nic": "0000:3b:02.3"}
REF = ClaimRef("default", "nic-claim", "u1")
ADDRESS = "0000:3b:02.1"


def claim(**parameters: Any) -> AllocatedClaim:
    entry = ConfigEntry(ConfigSource.CLAIM, (), {"apiVersion": "cdiplug.dev/v1alpha1", "kind": "PciConfig", **parameters})
    return AllocatedClaim(REF, (AllocatedDevice("nic", "n1", "vf-1"),), (entry,))


async def test_vfio_and_release_per_claim(world: World, tree: SysfsTree, kernel: FakeSysfsKernel) -> None:
    add_nic_with_vfs(tree, vfs=4)
    backend = make_backend(world, [VFIO, VFIO_KEEP, PLAIN], writer=kernel)
    async with running(backend) as sink:
        snap = sink.latest["example.com/nic-vfio"]
        device = snap.get(ADDRESS)
        assert device is not None and device.edits.device_nodes  # the resource binds: /dev/vfio/41

        def shape(resource: str, **parameters: Any) -> claim_config.Configured:
            d = sink.latest[resource].get(ADDRESSES[resource])
            assert d is not None
            return claim_config.configure(claim(**parameters), {"vf-1": d}, resource, backend)["vf-1"]

        default = shape("example.com/nic-vfio")
        assert (default.device, default.prepare, default.release, default.common_edits) == (device, True, True, True)
        host = shape("example.com/nic-vfio", vfio=False)
        assert (host.prepare, host.release, host.common_edits) == (False, False, False)
        assert host.device.edits.device_nodes == () and dict(host.device.edits.env) == {"PCI_DEVICE_0000_3B_02_1": ADDRESS}
        assert shape("example.com/nic-vfio", release="keep").release is False
        assert shape("example.com/nic", vfio=False).prepare  # nothing to bind anyway: as the resource has it

        for resource, parameters, message in [
            (
                "example.com/nic",
                {"vfio": True},
                "vfio: true needs resource example.com/nic to have vfio: true @ $.parameters.vfio",
            ),
            (
                "example.com/nic-keep",
                {"release": "restore"},
                "release: restore needs resource example.com/nic-keep to have release: restore",
            ),
            ("example.com/nic-vfio", {"vfio": False, "release": "keep"}, "release needs vfio: true"),
            ("example.com/nic-vfio", {"vfoi": False}, 'unknown field "vfoi" @ $.parameters'),
            ("example.com/nic-vfio", {"vfio": "no"}, "expected true or false"),
        ]:
            with pytest.raises(InvalidRequest) as caught:
                shape(resource, **parameters)
            assert message in str(caught.value) and "(claim default/nic-claim, request nic)" in str(caught.value)

        admin_claim = AllocatedClaim(REF, (AllocatedDevice("nic", "n1", "vf-1", admin_access=True),))
        admin = claim_config.configure(admin_claim, {"vf-1": device}, "example.com/nic-vfio", backend)["vf-1"]
        assert (admin.prepare, admin.release, admin.common_edits) == (False, False, False)
        assert admin.device.edits.device_nodes == ()  # never the group node: no DMA for a monitor
        assert dict(admin.device.edits.env) == {"PCI_DEVICE_0000_3B_02_1": ADDRESS, "CDIPLUG_ADMIN_ACCESS": "true"}

        await backend.prepare("example.com/nic-vfio", [device])  # an earlier claim bound it, release: keep
        with pytest.raises(InvalidRequest, match="on vfio-pci already"):
            shape("example.com/nic-vfio", vfio=False)
