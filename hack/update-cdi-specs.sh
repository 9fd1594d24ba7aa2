#!/usr/bin/env bash
# Regenerate the example CDI specs in cdi-specs/ exactly as cdiplug writes them.
#
#   hack/update-cdi-specs.sh [OUTPUT_DIR]     (default: cdi-specs/ of this checkout)
#
# - cdiplug-example.com-fpga.json: `cdiplug cdi generate` with the built-in default (fake FPGAs);
# - cdiplug-example.com-nic-vfio.json: the PCI backend with vfio on a fake sysfs tree
#   (cdiplug_backends.pci.testing.SysfsTree: an Intel X710 PF with two VFs, each in its own IOMMU group);
# - cdiplug-cdiplug.nvidia.com-gpu.json: the NVIDIA backend on cdiplug_backends.nvidia.testing.FakeNvml's
#   2x4 NVLink-pair A100 machine.
#
# tests/cdiplug/cdi/test_example_specs.py runs this into a temporary folder and fails when
# cdi-specs/ differs, so run it after changing anything that shapes a spec. PYTHON picks the
# interpreter that has cdiplug installed (default: python3).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$repo/cdi-specs}"
python="${PYTHON:-python3}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
# Only cdiplug's own files are regenerated; drop the old ones so a removed example goes away.
find "$out" -maxdepth 1 -name 'cdiplug-*.json' -type f -delete

# The built-in default configuration (no --config), whatever the caller's environment says.
env -u CDIPLUG_CONFIG -u CDIPLUG_SYSFS_ROOT -u CDIPLUG_DEV_ROOT \
  "$python" -m cdiplug cdi generate --output-dir "$out" >/dev/null

# The hardware backends, on the fixture trees their tests use.
"$python" - "$out" <<'PY'
import asyncio
import sys
import tempfile
from pathlib import Path

from cdiplug.cdi.writer import SpecWriter
from cdiplug.config import parse_config
from cdiplug.discovery import discover_once
from cdiplug_backends.nvidia.testing import FakeNvml
from cdiplug_backends.pci.testing import FakeUdevMonitor, SysfsTree
from cdiplug.models.world import World
from cdiplug_backends.nvidia import make_plugin as nvidia_plugin
from cdiplug_backends.pci import make_plugin as pci_plugin


async def write(out: Path, resources: list[dict], world: World, plugins: dict) -> None:
    config = parse_config({"resources": resources}, "hack/update-cdi-specs.sh", plugins)
    snapshots = await discover_once(config, world, plugins=plugins)
    writer = SpecWriter(out)
    for resource in config.resources:
        writer.write(resource.cdi_kind, snapshots[resource.name])


async def main(out: Path, tmp: Path) -> None:
    tree = SysfsTree(tmp / "pci-sys", tmp / "pci-root")
    tree.add_function("0000:3b:00.0", vendor=0x8086, device=0x1572, driver="i40e", iommu_group=40, numa_node=0, netdevs=["ens1f0"])
    tree.add_vfs("0000:3b:00.0", ["0000:3b:02.0", "0000:3b:02.1"], device=0x154C, driver="iavf", first_group=41, netdev_prefix="ens1f0")
    tree.enable_vfio()
    nic = {"name": "example.com/nic-vfio", "backend": "pci",
           "options": {"selectors": [{"vendor": "0x8086", "device": "0x154c"}], "vfio": True}}
    await write(out, [nic], World(sysfs_root=tree.root, dev_root=tmp / "pci-root", cdi_dir=out,
                                  state_dir=tmp / "state"), {"pci": pci_plugin(udev_monitor=FakeUdevMonitor())})

    nvml = FakeNvml.nvlink_pairs()
    nvml.write_sysfs(tmp / "gpu-sys")
    nvml.write_dev(tmp / "gpu-root")
    gpu = {"name": "nvidia.com/gpu", "backend": "nvidia", "cdi_kind": "cdiplug.nvidia.com/gpu"}
    await write(out, [gpu], World(sysfs_root=tmp / "gpu-sys", dev_root=tmp / "gpu-root", cdi_dir=out,
                                  state_dir=tmp / "state"), {"nvidia": nvidia_plugin(nvml=nvml)})


with tempfile.TemporaryDirectory(prefix="cdiplug-examples-") as tmp:
    asyncio.run(main(Path(sys.argv[1]), Path(tmp)))
PY
