"""``cdiplug serve``'s DRA flags: --node-name, --kubeconfig, --plugins-registry-dir, --plugins-dir.

Each has its default (the README's command-line contract), reads ``CDIPLUG_<FLAG>`` from the
environment, and a flag on the command line wins; the values end up in the World.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from cdiplug.cli import build_parser, world_from_args


def world_for(*argv: str):  # type: ignore[no-untyped-def]
    return world_from_args(build_parser().parse_args(["serve", *argv]))


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("NODE_NAME", "CDIPLUG_NODE_NAME", "CDIPLUG_KUBECONFIG", "CDIPLUG_PLUGINS_DIR", "CDIPLUG_PLUGINS_REGISTRY_DIR"):
        monkeypatch.delenv(name, raising=False)
    world = world_for()
    assert world.node_name == socket.gethostname().lower()
    assert world.kubeconfig is None  # in-cluster, else $KUBECONFIG: the client decides
    assert world.plugins_registry_dir == Path("/var/lib/kubelet/plugins_registry")
    assert world.plugins_dir == Path("/var/lib/kubelet/plugins")


def test_node_name_comes_from_the_downward_api(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CDIPLUG_NODE_NAME", raising=False)
    monkeypatch.setenv("NODE_NAME", "worker-7")
    assert world_for().node_name == "worker-7"


def test_environment_then_flags(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("NODE_NAME", "from-downward-api")
    monkeypatch.setenv("CDIPLUG_NODE_NAME", "from-env")
    monkeypatch.setenv("CDIPLUG_KUBECONFIG", str(tmp_path / "env.kubeconfig"))
    monkeypatch.setenv("CDIPLUG_PLUGINS_REGISTRY_DIR", str(tmp_path / "reg"))
    monkeypatch.setenv("CDIPLUG_PLUGINS_DIR", str(tmp_path / "plugins"))
    world = world_for()
    assert (world.node_name, world.kubeconfig) == ("from-env", tmp_path / "env.kubeconfig")
    assert (world.plugins_registry_dir, world.plugins_dir) == (tmp_path / "reg", tmp_path / "plugins")
    world = world_for("--node-name", "from-flag", "--kubeconfig", "/k", "--plugins-registry-dir", "/r", "--plugins-dir", "/p")
    assert (world.node_name, world.kubeconfig, world.plugins_registry_dir, world.plugins_dir) == (
        "from-flag",
        Path("/k"),
        Path("/r"),
        Path("/p"),
    )


def test_instance_names_the_deployment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("CDIPLUG_INSTANCE", raising=False)
    world = world_for("--state-dir", str(tmp_path))
    assert (world.instance, world.own_state_dir) == ("", tmp_path)  # the default keeps today's files
    monkeypatch.setenv("CDIPLUG_INSTANCE", "dra-side")
    world = world_for("--state-dir", str(tmp_path))
    assert (world.instance, world.own_state_dir) == ("dra-side", tmp_path / "instances" / "dra-side")
    assert world_for("--instance", "dp-side").instance == "dp-side"  # the flag wins


@pytest.mark.parametrize("bad", ["Upper", "with.dot", "-lead", "x" * 64, "a/b"])
def test_a_bad_instance_name_is_refused_naming_the_flag(monkeypatch: pytest.MonkeyPatch, bad: str) -> None:
    from cdiplug.cli import main

    monkeypatch.setenv("CDIPLUG_INSTANCE", bad)
    with pytest.raises(Exception, match=r"--instance \(or \$CDIPLUG_INSTANCE\): instance name .* must be a DNS label"):
        world_for()
    assert main(["serve", f"--instance={bad}", "--config", "/nonexistent"]) == 2
