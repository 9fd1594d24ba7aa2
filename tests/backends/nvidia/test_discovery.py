"""NVIDIA discovery against FakeNvml and a temporary sysfs/dev tree (also SysfsTree's Linux layout): what each GPU looks like, NUMA
from sysfs, device nodes present or absent, selectors splitting GPUs into resources, driver mounts.

Runs the real backend (``NvidiaBackend.run``) with a recording sink where the behaviour is about
whole snapshots; pure functions are called directly.
"""

from __future__ import annotations

import os
from pathlib import Path

import attrs
import pytest

from cdiplug.models.devices import DeviceNode, Health, Mount, Version
from cdiplug.models.world import World
from cdiplug_backends.nvidia.discovery import IDS_ENV, assign, discover, numa_node
from cdiplug_backends.nvidia.driver import driver_mounts
from cdiplug_backends.nvidia.nvml import Nvml
from cdiplug_backends.nvidia.options import NvidiaOptions
from cdiplug_backends.nvidia.testing import FakeGpu, FakeNvml
from cdiplug_backends.pci.testing import SysfsTree


def mixed_machine() -> FakeNvml:
    """2 H100 (NUMA 0) and 2 A10 (NUMA 1)."""
    gpus = [
        FakeGpu(uuid=f"GPU-h100-{i}", name="NVIDIA H100 80GB HBM3", pci_bus_id=f"0000:1{i}:00.0", minor=i, numa_node=0)
        for i in range(2)
    ] + [
        FakeGpu(
            uuid=f"GPU-a10-{i}",
            name="NVIDIA A10",
            memory_total=24 * 2**30,
            pci_bus_id=f"0000:8{i}:00.0",
            minor=2 + i,
            numa_node=1,
        )
        for i in range(2)
    ]
    return FakeNvml(gpus)


async def test_every_gpu_with_its_facts(world: World, nv, sink) -> None:
    w = nv.machine(world, FakeNvml.nvswitch8())
    async with nv.running(nv.backend(nv.resources({"name": "nvidia.com/gpu"}), w), sink):
        snap = sink.latest["nvidia.com/gpu"]
    assert len(snap.devices) == 8
    dev = snap.get("GPU-5a1c0000-0000-4000-8000-000000000005")
    assert dev is not None and dev.health is Health.HEALTHY
    assert dev.numa_nodes == (1,)
    assert dev.edits.device_nodes == (DeviceNode(path="/dev/nvidia5", permissions="rw"),)
    assert dict(dev.attributes) == {
        "vendor": "NVIDIA",
        "model": "NVIDIA H100 80GB HBM3",
        "index": "5",
        "minor": "5",
        "memory": "80GiB",
        "pci_address": "0000:ab:00.0",
        "mig_mode": "disabled",
        # typed, for DRA
        "productName": "NVIDIA H100 80GB HBM3",
        "uuid": "GPU-5a1c0000-0000-4000-8000-000000000005",
        "gpuIndex": 5,
        "architecture": "Hopper",
        "cudaComputeCapability": Version("9.0.0"),
        "driverVersion": Version("550.54.15"),
        "numaNode": 1,
        "resource.kubernetes.io/pciBusID": "0000:ab:00.0",
    }
    assert dict(dev.capacity) == {"memory": str(80 * 1024**3)}
    assert snap.ids_env == IDS_ENV == "NVIDIA_VISIBLE_DEVICES"
    assert [n.path for n in snap.common_edits.device_nodes] == [
        "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset",
    ]  # fmt: skip
    assert snap.common_edits.mounts == ()


def test_numa_node_from_sysfs(tmp_path: Path) -> None:
    devices = tmp_path / "bus/pci/devices"
    (devices / "0000:01:00.0").mkdir(parents=True)
    (devices / "0000:01:00.0/numa_node").write_text("1\n")
    (devices / "0000:02:00.0").mkdir()
    (devices / "0000:02:00.0/numa_node").write_text("-1\n")
    # As on Linux: bus/pci/devices/<addr> is a link into the devices tree.
    real = tmp_path / "devices/pci0000:80/0000:80:01.0/0000:81:00.0"
    real.mkdir(parents=True)
    (real / "numa_node").write_text("3\n")
    os.symlink(os.path.relpath(real, devices), devices / "0000:81:00.0")
    assert numa_node(tmp_path, "0000:01:00.0") == 1
    assert numa_node(tmp_path, "0000:02:00.0") is None  # -1: the kernel does not know
    assert numa_node(tmp_path, "0000:81:00.0") == 3
    assert numa_node(tmp_path, "0000:99:00.0") is None  # no such device
    assert numa_node(tmp_path, "../../etc") is None  # never leaves sysfs


async def test_numa_from_a_sysfs_tree_laid_out_as_linux_does(world: World, nv, sink) -> None:
    fake = FakeNvml.pcie_box()
    tree = SysfsTree(world.sysfs_root)
    for gpu, node in zip(fake.gpus, (1, 1, 0, -1), strict=True):
        tree.add_function(gpu.pci_bus_id, vendor=0x10DE, device=0x2236, class_code=0x030200, driver="nvidia", numa_node=node)
    fake.write_dev(world.dev_root)
    async with nv.running(
        nv.backend(nv.resources({"name": "nvidia.com/gpu"}), nv.GpuWorld(**attrs.asdict(world, recurse=False), nvml=fake)), sink
    ):
        snap = sink.latest["nvidia.com/gpu"]
    assert [d.numa_nodes for d in snap.devices] == [(1,), (1,), (0,), ()]


async def test_control_nodes_only_where_present_and_missing_gpu_node_is_unhealthy(world: World, nv, sink) -> None:
    fake = FakeNvml.pcie_box()
    fake.write_sysfs(world.sysfs_root)
    fake.write_dev(world.dev_root, control=("nvidiactl", "nvidia-uvm"))
    (world.dev_root / "dev/nvidia3").unlink()
    w = nv.GpuWorld(**attrs.asdict(world, recurse=False), nvml=fake)
    async with nv.running(nv.backend(nv.resources({"name": "nvidia.com/gpu"}), w), sink):
        snap = sink.latest["nvidia.com/gpu"]
    assert [n.path for n in snap.common_edits.device_nodes] == ["/dev/nvidiactl", "/dev/nvidia-uvm"]
    health = {d.attribute("minor"): d.health for d in snap.devices}
    assert health == {"0": Health.HEALTHY, "1": Health.HEALTHY, "2": Health.HEALTHY, "3": Health.UNHEALTHY}
    # the missing node still names the GPU's node: CDI needs non-empty edits, and it may come back
    assert snap.devices[3].edits.device_nodes[0].path == "/dev/nvidia3"


async def test_selectors_split_gpus_into_resources(world: World, nv, sink) -> None:
    w = nv.machine(world, mixed_machine())
    res = nv.resources(
        {"name": "nvidia.com/h100", "options": {"selectors": [{"model": "*H100*"}]}},
        {"name": "nvidia.com/big", "options": {"selectors": [{"memory_min": "20GiB"}]}},  # H100s already taken
        {"name": "nvidia.com/rest"},
    )
    async with nv.running(nv.backend(res, w), sink):
        ids = {name: sink.latest[name].ids for name in ("nvidia.com/h100", "nvidia.com/big", "nvidia.com/rest")}
    assert ids == {
        "nvidia.com/h100": ("GPU-h100-0", "GPU-h100-1"),
        "nvidia.com/big": ("GPU-a10-0", "GPU-a10-1"),
        "nvidia.com/rest": (),
    }


def test_first_resource_that_selects_wins_and_no_selectors_take_all(world: World, nv) -> None:
    fake = mixed_machine()
    nvml = Nvml(fake)
    nvml.init()
    gpus = discover(nvml, nv.machine(world, fake)).gpus
    res = nv.resources(
        {"name": "nvidia.com/one", "options": {"selectors": [{"indices": [3]}, {"uuids": ["GPU-h100-1"]}]}},
        {"name": "nvidia.com/all"},
    )
    got = {name: [g.uuid for g in found] for name, found in assign(gpus, res).items()}
    assert got == {"nvidia.com/one": ["GPU-h100-1", "GPU-a10-1"], "nvidia.com/all": ["GPU-h100-0", "GPU-a10-0"]}


def test_a_gpu_nvml_cannot_describe_is_skipped(world: World, nv) -> None:
    fake = FakeNvml.pcie_box()
    fake.fail_probe(fake.gpus[1].uuid)
    nvml = Nvml(fake)
    nvml.init()
    inventory = discover(nvml, nv.machine(world, fake))
    assert [g.info.index for g in inventory.gpus] == [0, 2, 3]
    assert inventory.skipped[0][0] == "GPU 1" and "GPU_IS_LOST" in inventory.skipped[0][1]


def test_driver_mounts_only_what_exists_inside_the_root(world: World) -> None:
    root = world.dev_root / "run/nvidia/driver"
    lib = root / "usr/lib/x86_64-linux-gnu"
    lib.mkdir(parents=True)
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/nvidia-smi").write_text("#!/bin/sh\n")
    (lib / "libcuda.so.550.54.15").write_text("elf")
    os.symlink("libcuda.so.550.54.15", lib / "libcuda.so.1")
    os.symlink("/etc/passwd", lib / "libnvidia-ml.so.1")  # leaves the root: refused
    opts = NvidiaOptions(driver_root=Path("/run/nvidia/driver"))
    assert driver_mounts(world, opts) == (
        Mount(host_path="/run/nvidia/driver/usr/bin/nvidia-smi", container_path="/usr/bin/nvidia-smi"),
        Mount(
            host_path="/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15",
            container_path="/usr/lib/x86_64-linux-gnu/libcuda.so.1",
        ),
    )
    assert driver_mounts(world, NvidiaOptions()) == ()


async def test_driver_mounts_are_common_edits(world: World, nv, sink) -> None:
    (world.dev_root / "usr/bin").mkdir(parents=True)
    (world.dev_root / "usr/bin/nvidia-smi").write_text("#!/bin/sh\n")
    w = nv.machine(world, FakeNvml.pcie_box())
    res = nv.resources({"name": "nvidia.com/gpu", "options": {"driver_root": "/", "driver_files": ["usr/bin/nvidia-*"]}})
    async with nv.running(nv.backend(res, w), sink):
        snap = sink.latest["nvidia.com/gpu"]
    assert snap.common_edits.mounts == (Mount(host_path="/usr/bin/nvidia-smi", container_path="/usr/bin/nvidia-smi"),)


@pytest.mark.parametrize(
    ("reported", "published"),
    [("550.54.15", "550.54.15"), ("580.159.04", "580.159.4"), ("535.104", "535.104.0"), ("570", "570.0.0")],
)
def test_driver_versions_become_semver(reported: str, published: str) -> None:
    # A real H200 reports 580.159.04: not semver (a leading zero), so DRA would publish it as a
    # string, and CEL could not compare it as a version.
    from cdiplug.dra.slices import attribute_value
    from cdiplug_backends.nvidia.discovery import _semver

    assert _semver(reported) == published
    assert attribute_value(Version(_semver(reported))) == {"version": published}
