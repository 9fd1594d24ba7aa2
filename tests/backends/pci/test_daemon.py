"""The PCI backend inside the real daemon (cdiplug.daemon.serve, in this event loop) talking real gRPC
over unix sockets to the kubelet stand-in: Allocate binds a VF's IOMMU group (fake sysfs tree,
FakeSysfsKernel passed in through a test BackendPlugin) and answers with /dev/vfio DeviceSpecs,
PCI_RESOURCE_* and CDI names whose spec is on disk; concurrent Allocates bind once; a function in
use is refused with FAILED_PRECONDITION naming the device and the reason; iommufd nodes appear."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from cdiplug.backend import BackendPlugin
from cdiplug.config import parse_config
from cdiplug.models.world import World
from cdiplug.testing import KubeletStandIn, running_daemon
from cdiplug_backends.pci import PciBackend, PciOptions
from cdiplug_backends.pci.testing import FakeSysfsKernel, SysfsTree

NIC, NVME = "example.com/nic-vfio", "example.com/nvme"


@contextlib.asynccontextmanager
async def daemon(world: World, kernel: FakeSysfsKernel, mountinfo: Path) -> AsyncIterator[KubeletStandIn]:
    plugin = BackendPlugin(
        name="pci", options_type=PciOptions, create=lambda rs, w: PciBackend(rs, w, writer=kernel, verify_timeout=1)
    )
    config = parse_config(
        {
            "resources": [
                {"name": NIC, "backend": "pci", "options": {"selectors": [{"pf": "ens1f0"}], "vfio": True}},
                {
                    "name": NVME,
                    "backend": "pci",
                    "options": {"selectors": [{"class": "0x010802"}], "vfio": True, "mountinfo": str(mountinfo)},
                },
            ]
        },
        "test_daemon",
        {"pci": plugin},
    )
    async with KubeletStandIn(world.kubelet_dir) as kubelet, running_daemon(config, world, plugins={"pci": plugin}):
        for resource in (NIC, NVME):
            await kubelet.wait_registered(resource, timeout=20)
        yield kubelet


@pytest.fixture
def node(world: World, tmp_path: Path) -> tuple[SysfsTree, Path]:
    tree = SysfsTree(world.sysfs_root, world.dev_root)
    tree.enable_vfio(iommufd=True)
    tree.add_function("0000:3b:00.0", driver="i40e", iommu_group=5, numa_node=1, netdevs=["ens1f0"])
    tree.add_vfs("0000:3b:00.0", [f"0000:3b:02.{i}" for i in range(3)], driver="iavf", first_group=40, netdev_prefix="ens1f0")
    tree.add_function("0000:5e:00.0", vendor=0x144D, device=0xA808, class_code=0x010802, driver="nvme", iommu_group=9)
    tree.add_block("0000:5e:00.0", "nvme0n1", "259:0")
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text("30 1 259:0 / /var/lib/data rw - ext4 /dev/nvme0n1 rw\n")
    return tree, mountinfo


async def test_allocate_binds_and_answers(world: World, node) -> None:
    tree, mountinfo = node
    kernel = FakeSysfsKernel(tree, iommufd=True)
    async with daemon(world, kernel, mountinfo) as kubelet:
        assert {d.id for d in kubelet.devices(NIC)} == {"0000:3b:02.0", "0000:3b:02.1", "0000:3b:02.2"}
        assert all(d.numa_nodes == (1,) for d in kubelet.devices(NIC))
        pod = await kubelet.admit_pod("vm", {NIC: 2})
        assert pod.admitted, pod
        ids = pod.device_ids(NIC)
        groups = sorted(str(40 + int(i[-1])) for i in ids)
        paths = sorted(n.path for n in pod.device_specs)
        # Bound under iommufd, each function also has its /dev/vfio/devices/vfioN, known only
        # once bound: the answer comes from what the backend reports after preparing.
        cdevs = [p for p in paths if p.startswith("/dev/vfio/devices/vfio")]
        assert len(cdevs) == len(ids)
        assert [p for p in paths if p not in cdevs] == sorted(
            ["/dev/vfio/vfio", "/dev/iommu", *(f"/dev/vfio/{g}" for g in groups)]
        )
        assert pod.env["PCI_RESOURCE_EXAMPLE_COM_NIC_VFIO"] == ",".join(ids)
        assert set(pod.cdi_devices) == {f"{NIC}={i}" for i in ids}
        assert all(tree.driver_of(i) == "vfio-pci" for i in ids)
        spec = json.loads((world.cdi_dir / "cdiplug-example.com-nic-vfio.json").read_text())
        nodes = {d["name"]: [n["path"] for n in d["containerEdits"]["deviceNodes"]] for d in spec["devices"]}
        assert all(f"/dev/vfio/{40 + int(i[-1])}" in nodes[i] for i in ids)
        assert [n["path"] for n in spec["containerEdits"]["deviceNodes"]] == ["/dev/vfio/vfio", "/dev/iommu"]


async def test_iommufd_device_node_of_a_bound_function_is_in_answer_and_spec(world: World, node) -> None:
    tree, mountinfo = node
    kernel = FakeSysfsKernel(tree, iommufd=True)
    async with daemon(world, kernel, mountinfo) as kubelet:
        (answer,) = await kubelet.allocate(NIC, ["0000:3b:02.0"])
        spec = json.loads((world.cdi_dir / "cdiplug-example.com-nic-vfio.json").read_text())
        device = next(d for d in spec["devices"] if d["name"] == "0000:3b:02.0")
        assert "/dev/vfio/devices/vfio0" in [n["path"] for n in device["containerEdits"]["deviceNodes"]]
        assert "/dev/vfio/devices/vfio0" in [n.path for n in answer.device_specs]


async def test_concurrent_allocates_bind_once(world: World, node) -> None:
    tree, mountinfo = node
    kernel = FakeSysfsKernel(tree)
    async with daemon(world, kernel, mountinfo) as kubelet:
        answers = await asyncio.gather(*(kubelet.allocate(NIC, ["0000:3b:02.1"]) for _ in range(4)))
        assert all(a[0].device_ids == ("0000:3b:02.1",) for a in answers)
    assert [w for w in kernel.writes if w[0] == "bus/pci/drivers_probe"] == [("bus/pci/drivers_probe", "0000:3b:02.1")]


async def test_function_in_use_is_refused_naming_device_and_reason(world: World, node) -> None:
    tree, mountinfo = node
    kernel = FakeSysfsKernel(tree)
    async with daemon(world, kernel, mountinfo) as kubelet:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await kubelet.allocate(NVME, ["0000:5e:00.0"])
        assert err.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert "0000:5e:00.0" in err.value.details() and "mounted on /var/lib/data" in err.value.details()
        pod = await kubelet.admit_pod("db", {NVME: 1})
        assert not pod.admitted and pod.code == "FAILED_PRECONDITION"
    assert kernel.writes == [] and tree.driver_of("0000:5e:00.0") == "nvme"
