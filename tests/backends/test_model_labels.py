"""The backends' ModelLabels: what names their devices' model on the node (cdiplug.dev/ labels).

Each backend discovers as the daemon would (cdiplug.discovery.discover_once): the NVIDIA backend
over FakeNvml's 2x4 NVLink machine (8 identical GPUs with driver and compute capability), the
PCI backend over a fake sysfs tree (SysfsTree); the labels are those cdiplug.kube.node_labels
writes from them. Covers: NVIDIA product, memory in MiB, compute capability and driver version
as integers; PCI vendor and device, left out when the functions of one resource differ.
"""

from __future__ import annotations

from cdiplug.backend import Abilities, load_plugins
from cdiplug.config import parse_config
from cdiplug.discovery import discover_once
from cdiplug.kube.node_labels import resource_labels
from cdiplug.models.world import World
from cdiplug_backends.nvidia import make_plugin
from cdiplug_backends.nvidia.testing import FakeNvml
from cdiplug_backends.pci.testing import SysfsTree


async def labels_of(data: dict[str, object], world: World, plugins: dict[str, object] | None = None) -> dict[str, dict[str, str]]:
    registry = load_plugins()
    all_plugins = {**{n: registry[n] for n in registry}, **(plugins or {})}
    config = parse_config(data, "test", all_plugins)  # type: ignore[arg-type]
    abilities: dict[str, Abilities] = {}
    snapshots = await discover_once(config, world, all_plugins, abilities=abilities)  # type: ignore[arg-type]
    return {name: resource_labels(snap, abilities[name].model_labels)[0] for name, snap in snapshots.items()}


async def test_nvidia_labels_name_the_gpu_model(world: World) -> None:
    fake = FakeNvml.nvlink_pairs()
    fake.write_sysfs(world.sysfs_root)
    fake.write_dev(world.dev_root)
    labels = await labels_of(
        {"resources": [{"name": "nvidia.com/gpu", "backend": "nvidia"}]}, world, {"nvidia": make_plugin(nvml=fake)}
    )
    assert labels["nvidia.com/gpu"] == {
        "cdiplug.dev/nvidia.com.gpu.product": "NVIDIA-A100-80GB-PCIe",
        "cdiplug.dev/nvidia.com.gpu.family": "Hopper",
        "cdiplug.dev/nvidia.com.gpu.memory": "81920",  # MiB: `Gt 40000` selects the 80 GB ones
        "cdiplug.dev/nvidia.com.gpu.compute.major": "9",
        "cdiplug.dev/nvidia.com.gpu.compute.minor": "0",
        "cdiplug.dev/nvidia.com.gpu.driver.major": "550",
        "cdiplug.dev/nvidia.com.gpu.driver.minor": "54",
        "cdiplug.dev/nvidia.com.gpu.driver.rev": "15",
        "cdiplug.dev/nvidia.com.gpu.count": "8",
    }


async def test_pci_labels_name_vendor_and_device(world: World) -> None:
    tree = SysfsTree(world.sysfs_root, world.dev_root)
    tree.enable_vfio()
    tree.add_function("0000:01:00.0", vendor=0x10DE, device=0x2330, class_code=0x030200, iommu_group=7)
    tree.add_function("0000:02:00.0", vendor=0x10DE, device=0x2330, class_code=0x030200, iommu_group=8)
    tree.add_function("0000:03:00.0", vendor=0x8086, device=0x1572, class_code=0x020000, driver="i40e", iommu_group=9)
    tree.add_function("0000:04:00.0", vendor=0x8086, device=0x10FB, class_code=0x020000, driver="ixgbe", iommu_group=10)
    labels = await labels_of(
        {
            "resources": [
                {"name": "example.com/gpu", "backend": "pci", "options": {"selectors": [{"class": "0x030200"}], "vfio": True}},
                {
                    "name": "example.com/any",
                    "backend": "pci",
                    "options": {"selectors": [{"vendor": "0x8086"}]},
                },
            ]
        },
        world,
    )
    assert labels["example.com/gpu"] == {
        "cdiplug.dev/example.com.gpu.vendor": "0x10de",
        "cdiplug.dev/example.com.gpu.device": "0x2330",
        "cdiplug.dev/example.com.gpu.count": "2",
    }
    assert labels["example.com/any"] == {  # two devices of one vendor: no device ID to name
        "cdiplug.dev/example.com.any.vendor": "0x8086",
        "cdiplug.dev/example.com.any.count": "2",
    }
