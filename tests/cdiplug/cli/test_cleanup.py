"""``cdiplug cleanup --instance NAME``: one instance's files leave the node, nobody else's.

Two instances' files side by side in real folders (CDI specs, device-plugin and DRA sockets
bound by nobody, DRA driver folders, state, claims as a stopped daemon leaves them): cleanup of
one removes exactly its own; while the instance's daemon holds its claims, cleanup waits and then
refuses, naming it.
"""

from __future__ import annotations

import socket
from pathlib import Path

import attrs
import pytest

from cdiplug.cli import main
from cdiplug.host.owners import Owners
from cdiplug.models.instance import DRA_DRIVER, RESOURCE
from cdiplug.models.world import World
from cdiplug.testing import ApiServerStandIn

UID = "11111111-2222-3333-4444-555555555555"


def dead_socket(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.close()  # nobody answers: as a killed daemon leaves it


def lay_out(world: World, resource: str, driver: str) -> list[Path]:
    """The files an instance serving ``resource`` (device plugin) and ``driver`` (DRA) leaves behind."""
    names = world.names
    files = [
        world.cdi_dir / names.resource_spec(resource),
        world.own_state_dir / "dra-claims.json.lock",
        world.cdi_dir / names.claim_spec(UID),
        world.cdi_dir / f".{names.resource_spec(resource)}.1.2.tmp",
        world.own_state_dir / "dra-claims.json",
        world.own_state_dir / "pci" / "bound" / "x.json",
    ]
    for path in files:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}")
    sockets = [
        world.kubelet_dir / (resource.replace("/", "-") + ".sock"),
        world.plugins_registry_dir / f"{driver}-reg.sock",
        world.plugins_dir / driver / "dra.sock",
    ]
    for path in sockets:
        dead_socket(path)
    owners = Owners(world.state_dir, world.instance)
    owners.claim([(RESOURCE, resource), (DRA_DRIVER, driver)])
    owners.close()  # the daemon stopped
    return files + sockets + [world.plugins_dir / driver]


def args(world: World, *extra: str) -> list[str]:
    return [
        "cleanup",
        f"--instance={world.instance}",
        *("--kubelet-dir", str(world.kubelet_dir), "--cdi-dir", str(world.cdi_dir), "--state-dir", str(world.state_dir)),
        *("--plugins-dir", str(world.plugins_dir), "--plugins-registry-dir", str(world.plugins_registry_dir)),
        *("--sysfs-root", str(world.sysfs_root), "--dev-root", str(world.dev_root)),
        *extra,
    ]


@pytest.fixture
def two(world: World, short_tmp: Path) -> tuple[World, World]:
    base = attrs.evolve(world, plugins_dir=short_tmp / "plugins", plugins_registry_dir=short_tmp / "reg")
    return base, attrs.evolve(base, instance="blue")


@pytest.mark.parametrize("which", [0, 1])
def test_cleanup_removes_one_instances_files_only(
    two: tuple[World, World], which: int, capsys: pytest.CaptureFixture[str]
) -> None:
    default, blue = two
    unrelated = default.state_dir / "someone-elses.txt"  # a --state-dir shared with other software
    unrelated.write_text("x")
    theirs = {0: lay_out(default, "example.com/fpga", "fpga.example.com"), 1: lay_out(blue, "example.com/nic", "nic.example.com")}
    target = two[which]
    assert main(args(target)) == 0
    out = capsys.readouterr().out
    assert "nothing of it is left on this node" in out
    assert [p for p in theirs[which] if p.exists() or p.is_symlink()] == []
    assert [p for p in theirs[1 - which] if not p.exists()] == []
    assert unrelated.read_text() == "x"
    other_claims = [p for p in (default.state_dir / "owners").iterdir() if not p.name.startswith(".")]
    assert len(other_claims) == 2  # the other instance's resource and driver


def test_cleanup_waits_for_the_daemon_and_refuses_naming_it(two: tuple[World, World], capsys: pytest.CaptureFixture[str]) -> None:
    _, blue = two
    files = lay_out(blue, "example.com/nic", "nic.example.com")
    running = Owners(blue.state_dir, "blue")
    running.claim([(RESOURCE, "example.com/nic")])
    try:
        assert main(args(blue, "--wait", "0.3")) == 1
    finally:
        running.close()
    assert f"instance 'blue' (pid {__import__('os').getpid()}) still runs" in capsys.readouterr().err
    assert all(p.exists() for p in files)  # nothing touched


async def test_cleanup_with_api_deletes_the_instances_slices_and_node_labels(
    two: tuple[World, World], api: ApiServerStandIn, node_name: str, short_tmp: Path
) -> None:
    import asyncio

    from cdiplug.kube.client import connect

    default, blue = two
    kubeconfig = api.kubeconfig(short_tmp / "kubeconfig")
    lay_out(blue, "example.com/nic", "nic.example.com")
    lay_out(default, "example.com/fpga", "fpga.example.com")
    for driver, node in (("nic.example.com", node_name), ("nic.example.com", "node-b"), ("fpga.example.com", node_name)):
        name = f"{node}-{driver}"
        api.put_slice(
            {
                "metadata": {"name": name},
                "spec": {"driver": driver, "nodeName": node, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}},
            }
        )
    labels = {
        "cdiplug.dev/example.com.nic.count": "2",
        "cdiplug.dev/example.com.fpga.count": "2",
        "cdiplug.dev/config": "gpu",
        "team": "a",
    }
    client = connect(kubeconfig)
    try:
        await client.patch_node(node_name, {"metadata": {"labels": labels}})
    finally:
        await client.close()
    argv = args(blue, "--api", "--kubeconfig", str(kubeconfig), "--node-name", node_name)
    assert await asyncio.to_thread(main, argv) == 0
    assert sorted(s["metadata"]["name"] for s in api.slices()) == [f"{node_name}-fpga.example.com", "node-b-nic.example.com"]
    left = api.node(node_name)["metadata"]["labels"]
    assert left == {k: v for k, v in labels.items() if k != "cdiplug.dev/example.com.nic.count"}
