"""``cdiplug doctor`` on fake nodes: temporary kubelet folders with real unix sockets, runtime
configuration files as containerd and CRI-O ship them, and fake sysfs trees for the backends
(``SysfsTree``, ``FakeNvml``). Each case asserts the line a user reads and the exit status."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from cdiplug.backend import PluginRegistry
from cdiplug.cli import main
from cdiplug.config import load_config
from cdiplug.doctor import RuntimeFiles, backend_findings, examine
from cdiplug.models.checks import Finding, Verdict
from cdiplug.models.world import World
from cdiplug_backends import fake, pci
from cdiplug_backends.generic.testing import FakeDev
from cdiplug_backends.nvidia import make_plugin as nvidia_plugin
from cdiplug_backends.nvidia.testing import FakeGpu, FakeNvml
from cdiplug_backends.pci.testing import SysfsTree

CONTAINERD_V3 = """version = 3
[plugins.'io.containerd.cri.v1.runtime']
  enable_cdi = true
  cdi_spec_dirs = ['/etc/cdi', '{cdi}']
"""
CONTAINERD_V2_OFF = """version = 2
[plugins."io.containerd.grpc.v1.cri"]
  enable_cdi = false
  cdi_spec_dirs = ["/etc/cdi", "{cdi}"]
"""


@pytest.fixture
def node(world: World) -> Iterator[World]:
    """A node whose kubelet is up: its folders, and listening sockets where it has them."""
    listening = []
    world = World(
        kubelet_dir=world.kubelet_dir,
        cdi_dir=world.cdi_dir,
        state_dir=world.state_dir,
        sysfs_root=world.sysfs_root,
        dev_root=world.dev_root,
        pod_resources_socket=world.kubelet_dir.parent / "pr.sock",
        plugins_registry_dir=world.kubelet_dir.parent / "reg",
        plugins_dir=world.kubelet_dir.parent / "plugins",
    )
    world.plugins_registry_dir.mkdir()
    world.plugins_dir.mkdir()
    for path in (world.kubelet_socket, world.pod_resources_socket):
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(path))
        listening.append(s)
    yield world
    for s in listening:
        s.close()


def argv(world: World, *extra: str) -> list[str]:
    return [
        "doctor",
        "--kubelet-dir", str(world.kubelet_dir),
        "--cdi-dir", str(world.cdi_dir),
        "--state-dir", str(world.state_dir),
        "--sysfs-root", str(world.sysfs_root),
        "--dev-root", str(world.dev_root),
        "--pod-resources-socket", str(world.pod_resources_socket),
        "--plugins-registry-dir", str(world.plugins_registry_dir),
        "--plugins-dir", str(world.plugins_dir),
        "--proc-root", str(world.state_dir),  # no processes: no running containerd found
        "--crio-config-dir", str(world.state_dir / "no-crio.d"),
        *extra,
    ]  # fmt: skip


def doctor(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str], str]:
    try:
        code = main(list(args))
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


def containerd(tmp_path: Path, text: str, world: World) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text.format(cdi=world.cdi_dir))
    return path


def test_a_healthy_node_passes(capsys: pytest.CaptureFixture[str], node: World, tmp_path: Path) -> None:
    config = containerd(tmp_path, CONTAINERD_V3, node)
    code, lines, err = doctor(capsys, *argv(node, "--containerd-config", str(config)))
    assert code == 0, lines
    assert f"ok: containerd CDI: CDI is on (enable_cdi = true in {config})" in lines
    assert f"ok: device-plugin folder: {node.kubelet_dir} is there" in lines
    assert f"ok: kubelet registration socket: {node.kubelet_socket} is there" in lines
    assert f"ok: PodResources socket: {node.pod_resources_socket} is there" in lines
    assert not [line for line in lines if not line.startswith("ok: ")]
    assert "cdiplug doctor: 0 problems, 0 warnings" in err


def test_cdi_turned_off_in_containerd_is_a_problem(capsys: pytest.CaptureFixture[str], node: World, tmp_path: Path) -> None:
    config = containerd(tmp_path, CONTAINERD_V2_OFF, node)
    code, lines, _ = doctor(capsys, *argv(node, "--containerd-config", str(config)))
    assert code == 1
    (line,) = [line for line in lines if line.startswith("problem: containerd CDI")]
    assert f'CDI is turned off: enable_cdi = false in [plugins."io.containerd.grpc.v1.cri"] of {config}' in line
    assert f'(fix: set enable_cdi = true in [plugins."io.containerd.grpc.v1.cri"] of {config} and restart containerd)' in line


def test_containerd_1_7_without_enable_cdi_is_a_warning(capsys: pytest.CaptureFixture[str], node: World, tmp_path: Path) -> None:
    config = containerd(tmp_path, 'version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n  cdi_spec_dirs = ["{cdi}"]\n', node)
    code, lines, _ = doctor(capsys, *argv(node, "--containerd-config", str(config)))
    assert code == 0
    assert any(
        "warning: containerd CDI: enable_cdi is not set" in line and "containerd 1.7 leaves CDI off" in line for line in lines
    )


def test_spec_folder_the_runtime_does_not_read(capsys: pytest.CaptureFixture[str], node: World, tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text("version = 3\n")  # containerd 2.x: CDI on, /etc/cdi and /var/run/cdi
    code, lines, _ = doctor(capsys, *argv(node, "--containerd-config", str(config)))
    assert code == 1
    assert (
        f"problem: containerd CDI: reads CDI specs from /etc/cdi, /var/run/cdi ({config}), but cdiplug writes them into {node.cdi_dir}"
        in "\n".join(lines)
    )


def test_containerd_imports_are_read(capsys: pytest.CaptureFixture[str], node: World, tmp_path: Path) -> None:
    (tmp_path / "conf.d").mkdir()
    (tmp_path / "conf.d" / "cdi.toml").write_text(CONTAINERD_V2_OFF.format(cdi=node.cdi_dir))
    config = tmp_path / "config.toml"
    config.write_text(f'version = 2\nimports = ["{tmp_path}/conf.d/*.toml"]\n')
    code, lines, _ = doctor(capsys, *argv(node, "--containerd-config", str(config)))
    assert code == 1 and any("CDI is turned off" in line and "conf.d/cdi.toml" in line for line in lines)


def test_crio_drop_ins_win(capsys: pytest.CaptureFixture[str], node: World, tmp_path: Path) -> None:
    main_file = tmp_path / "crio.conf"
    main_file.write_text(f'[crio.runtime]\ncdi_spec_dirs = ["{node.cdi_dir}"]\n')
    drop_ins = tmp_path / "crio.conf.d"
    drop_ins.mkdir()
    (drop_ins / "10-cdi.conf").write_text('[crio.runtime]\ncdi_spec_dirs = ["/etc/cdi"]\n')
    args = argv(node, "--crio-config", str(main_file))
    args[args.index("--crio-config-dir") + 1] = str(drop_ins)
    code, lines, _ = doctor(capsys, *args)
    assert code == 1
    assert any(
        line.startswith(f"problem: CRI-O CDI: reads CDI specs from /etc/cdi ({main_file} and {drop_ins}/10-cdi.conf)")
        for line in lines
    )
    (drop_ins / "10-cdi.conf").unlink()
    code, lines, _ = doctor(capsys, *args)
    assert code == 0 and any(line.startswith("ok: CRI-O CDI: reads CDI specs from") for line in lines)


def test_no_kubelet(capsys: pytest.CaptureFixture[str], world: World, tmp_path: Path) -> None:
    world = attrs.evolve(
        world,
        plugins_registry_dir=tmp_path / "reg",
        plugins_dir=tmp_path / "plugins",
        pod_resources_socket=tmp_path / "pr.sock",
    )
    config = containerd(tmp_path, CONTAINERD_V3, world)
    code, lines, _ = doctor(capsys, *argv(world, "--containerd-config", str(config)))
    assert code == 1
    text = "\n".join(lines)
    assert (
        f"problem: kubelet registration socket: no socket at {world.kubelet_socket} (fix: the kubelet makes it at start" in text
    )
    assert "warning: DRA plugins folder: no folder at" in text and "(not needed by this configuration)" in text


def test_a_bad_configuration_is_a_problem(capsys: pytest.CaptureFixture[str], node: World, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("resources:\n  - {name: example.com/fpga, backend: fake, options: {count: -1}}\n")
    code, lines, _ = doctor(capsys, *argv(node, "--config", str(bad)))
    assert code == 1
    assert any(line.startswith("problem: configuration: ") and "$.resources[0].options.count" in line for line in lines)


async def findings_for(world: World, text: str, tmp_path: Path, plugins: PluginRegistry | None = None) -> list[Finding]:
    path = tmp_path / "cdiplug.yaml"
    path.write_text(text)
    return await backend_findings(load_config(path, plugins), world, plugins)


PCI_VFIO = "resources:\n  - {name: example.com/nic, backend: pci, options: {selectors: [{vendor: '0x8086'}], vfio: true}}\n"


async def test_pci_without_iommu_nor_vfio(world: World, tmp_path: Path) -> None:
    tree = SysfsTree(world.sysfs_root, world.dev_root)
    tree.add_function("0000:3b:00.0", driver="i40e")
    lines = [f.line() for f in await findings_for(world, PCI_VFIO, tmp_path)]
    assert any(
        line.startswith(f"problem: IOMMU: no IOMMU groups under {world.sysfs_root}/kernel/iommu_groups")
        and "intel_iommu=on" in line
        for line in lines
    )
    assert "problem: vfio-pci: the vfio-pci driver is not loaded (fix: load it: modprobe vfio-pci" in "\n".join(lines)


async def test_pci_ready_for_vfio(world: World, tmp_path: Path) -> None:
    tree = SysfsTree(world.sysfs_root, world.dev_root)
    tree.enable_vfio()
    tree.add_function("0000:3b:00.0", driver="i40e", iommu_group=5)
    found = await findings_for(world, PCI_VFIO, tmp_path)
    assert [f.verdict for f in found] == [Verdict.OK] * 3, [f.line() for f in found]
    assert found[0].detail.startswith("1 IOMMU groups")


async def test_nvidia_driver_and_nvml(world: World, tmp_path: Path) -> None:
    config = "resources:\n  - {name: nvidia.com/gpu, backend: nvidia}\n"
    good = PluginRegistry({"nvidia": nvidia_plugin(nvml=FakeNvml([FakeGpu("GPU-0")]))})
    lines = [f.line() for f in await findings_for(world, config, tmp_path, good)]
    assert lines == ["ok: NVIDIA driver: version 550.54.15", "ok: NVML: 1 GPU"]
    missing = FakeNvml([FakeGpu("GPU-0")])
    missing.fail_init()
    lines = [
        f.line() for f in await findings_for(world, config, tmp_path, PluginRegistry({"nvidia": nvidia_plugin(nvml=missing)}))
    ]
    assert lines[0].startswith(
        f"problem: NVIDIA driver: not loaded (no {world.sysfs_root}/module/nvidia) (fix: install the NVIDIA driver"
    )
    assert lines[1].startswith("problem: NVML: does not answer:")


GENERIC = (
    "resources:\n"
    "  - name: example.com/serial\n"
    "    backend: generic\n"
    "    options: {groups: [{paths: [{path: /dev/ttyUSB*}]}, {paths: [{path: /dev/fuse}, {path: /dev/net/tun, optional: true}]}]}\n"
)


async def test_generic_says_what_each_path_matches_now(world: World, tmp_path: Path) -> None:
    FakeDev(world.dev_root).node("/dev/fuse", 10, 229)
    lines = [f.line() for f in await findings_for(world, GENERIC, tmp_path)]
    assert lines[0] == (
        "warning: /dev/ttyUSB*: example.com/serial: options.groups[0].paths[0]: matched nothing "
        "(fix: plug the device in, or fix the glob or selector (cdiplug discover lists what this node has))"
    )
    assert lines[1] == "ok: /dev/fuse: example.com/serial: options.groups[1].paths[0]: matched /dev/fuse (c 10:229)"
    assert lines[2] == "ok: /dev/net/tun: example.com/serial: options.groups[1].paths[1]: matched nothing (optional)"
    FakeDev(world.dev_root).node("/dev/ttyUSB0", 188, 0)
    found = await findings_for(world, GENERIC, tmp_path)
    assert {f.verdict for f in found} == {Verdict.OK}, [f.line() for f in found]


async def test_generic_with_nothing_on_the_node_warns_and_doctor_still_passes(world: World, tmp_path: Path) -> None:
    found = await findings_for(world, GENERIC, tmp_path)
    assert found[-1].line().startswith("warning: devices: example.com/serial: none found on this node now")
    assert Verdict.PROBLEM not in {f.verdict for f in found}  # an unplugged device is no reason for exit 1


async def test_examine_with_the_fake_backend(node: World, tmp_path: Path) -> None:
    files = RuntimeFiles(containerd=containerd(tmp_path, CONTAINERD_V3, node), proc_root=tmp_path, crio_dir=tmp_path / "none")
    found = await examine(node, None, files, plugins=PluginRegistry({"fake": fake.plugin, "pci": pci.plugin}))
    assert {f.verdict for f in found} == {Verdict.OK}


def test_json_output(capsys: pytest.CaptureFixture[str], node: World, tmp_path: Path) -> None:
    import json

    config = containerd(tmp_path, CONTAINERD_V2_OFF, node)
    code, lines, _ = doctor(capsys, *argv(node, "--containerd-config", str(config), "-o", "json"))
    assert code == 1
    found = json.loads("\n".join(lines))
    (bad,) = [f for f in found if f["verdict"] == "problem"]
    assert bad["subject"] == "containerd CDI" and bad["fix"].startswith("set enable_cdi = true")
    assert {f["verdict"] for f in found} == {"ok", "problem"}
