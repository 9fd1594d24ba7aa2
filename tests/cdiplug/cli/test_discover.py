"""``cdiplug discover`` as a user runs it: a subprocess against a fake sysfs tree (SysfsTree) given
with --sysfs-root, in table, JSON and YAML, with skip reasons; bad configuration exits 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from cdiplug.models.world import World
from cdiplug_backends.pci.testing import SysfsTree

CONFIG = """\
resources:
  - name: example.com/nic-vfio
    backend: pci
    options: {selectors: [{pf: ens1f0}], vfio: true, denylist: ["0000:3b:02.2"]}
  - name: example.com/gpu
    backend: pci
    options: {selectors: [{class: "0x030200"}], vfio: true}
  - name: example.com/fpga
    backend: fake
    options: {count: 1}
"""


def build(world: World) -> Path:
    tree = SysfsTree(world.sysfs_root, world.dev_root)
    tree.enable_vfio()
    tree.add_function("0000:3b:00.0", driver="i40e", iommu_group=5, numa_node=1, netdevs=["ens1f0"])
    tree.add_vfs("0000:3b:00.0", [f"0000:3b:02.{i}" for i in range(3)], driver="iavf", first_group=40)
    tree.add_function("0000:01:00.0", vendor=0x10DE, class_code=0x030200, iommu_group=7)
    tree.add_function("0000:01:00.1", vendor=0x10DE, class_code=0x040300, driver="snd_hda_intel", iommu_group=7)
    config = world.state_dir.parent / "cdiplug.yaml"
    config.write_text(CONFIG)
    return config


def discover(world: World, config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "cdiplug",
            "discover",
            "--config",
            str(config),
            "--sysfs-root",
            str(world.sysfs_root),
            "--dev-root",
            str(world.dev_root),
            "--state-dir",
            str(world.state_dir),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_json_shows_devices_and_skip_reasons(world: World) -> None:
    done = discover(world, build(world), "-o", "json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert list(data) == ["example.com/nic-vfio", "example.com/gpu", "example.com/fpga"]
    nic = data["example.com/nic-vfio"]
    assert [d["id"] for d in nic["devices"]] == ["0000:3b:02.0", "0000:3b:02.1"]
    first = nic["devices"][0]
    assert (first["numa_nodes"], first["prepare_group"], first["device_nodes"]) == ([1], "40", ["/dev/vfio/40"])
    assert nic["common_device_nodes"] == ["/dev/vfio/vfio"]
    assert nic["ids_env"] == "PCI_RESOURCE_EXAMPLE_COM_NIC_VFIO"
    assert nic["skipped"] == [{"id": "0000:3b:02.2", "reason": "on the denylist (0000:3b:02.2)"}]
    gpu = data["example.com/gpu"]
    assert gpu["devices"] == [] and "IOMMU group 7 also holds 0000:01:00.1" in gpu["skipped"][0]["reason"]
    assert [d["id"] for d in data["example.com/fpga"]["devices"]] == ["fpga-0"]


def test_yaml_is_the_same_data(world: World) -> None:
    config = build(world)
    as_yaml = yaml.safe_load(discover(world, config, "-o", "yaml").stdout)
    assert as_yaml == json.loads(discover(world, config, "-o", "json").stdout)


def test_table_for_people(world: World) -> None:
    done = discover(world, build(world))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "example.com/nic-vfio: 2 devices (2 healthy), 1 skipped" in out
    assert "common device nodes: /dev/vfio/vfio" in out
    row = next(line for line in out.splitlines() if line.strip().startswith("0000:3b:02.1"))
    assert row.split()[:5] == ["0000:3b:02.1", "Healthy", "1", "41", "/dev/vfio/41"]
    assert "  skipped 0000:3b:02.2: on the denylist (0000:3b:02.2)" in out
    assert "skipped 0000:01:00.0: IOMMU group 7 also holds 0000:01:00.1" in out


def test_bad_option_exits_2_naming_field_and_file(world: World) -> None:
    config = build(world)
    config.write_text(CONFIG.replace("{pf: ens1f0}", "{pf: ens1f0, vendor: intel}"))
    done = discover(world, config)
    assert done.returncode == 2
    assert "@ $.resources[0].options.selectors[0].vendor" in done.stderr and str(config) in done.stderr


def test_typed_attributes_and_capacity_print_as_json_and_yaml() -> None:
    # A GPU seen on a real H200 made `-o json` fail: versions (DRA's typed attributes) are no JSON.
    import json

    import yaml

    from cdiplug.cli.discover import as_data
    from cdiplug.models.devices import ContainerEdits, Device, DeviceSnapshot, Version

    gpu = Device(
        "GPU-1",
        edits=ContainerEdits(env={"A": "1"}),
        attributes={"driverVersion": Version("580.159.4"), "gpuIndex": 0, "productName": "NVIDIA H200", "mig": False},
        capacity={"memory": "143771Mi"},
    )
    data = as_data({"nvidia.com/gpu": DeviceSnapshot("nvidia.com/gpu", [gpu])})
    [device] = json.loads(json.dumps(data))["nvidia.com/gpu"]["devices"]
    assert device["attributes"] == {"driverVersion": "580.159.4", "gpuIndex": 0, "productName": "NVIDIA H200", "mig": False}
    assert device["capacity"] == {"memory": "143771Mi"}
    assert yaml.safe_load(yaml.safe_dump(data)) == json.loads(json.dumps(data))
