"""hack/lib/nodes.py, the node list of `hack/local-cluster.sh up --nodes N|FILE`: the built-in
heterogeneous cluster (node-c on CRI-O, FPGAs on two nodes, a fast accelerator node), each node's
cdiplug configuration written where the node's /etc/cdiplug is bound from and accepted by
cdiplug's own config checks, and bad files refused with the entry named."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from cdiplug.config import parse_config

SCRIPT = Path(__file__).resolve().parents[2] / "hack" / "lib" / "nodes.py"


def plan(source: str, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), "plan", source, str(out)], capture_output=True, text=True, timeout=60)


def test_built_in_three_nodes(tmp_path: Path) -> None:
    result = plan("3", tmp_path)
    assert result.returncode == 0, result.stderr
    lines = [line.split() for line in result.stdout.splitlines()]
    assert [(i, name, runtime) for i, name, runtime, _ in lines] == [
        ("1", "node-a", "containerd"),
        ("2", "node-b", "containerd"),
        ("3", "node-c", "cri-o"),
    ]
    for _, name, _, _ in lines:
        path = tmp_path / name / "config.yaml"
        parse_config(yaml.safe_load(path.read_text()), str(path))  # raises on a bad config
    nodes = yaml.safe_load((tmp_path / "nodes.yaml").read_text())
    assert [n["name"] for n in nodes] == ["node-a", "node-b", "node-c"]


def test_more_nodes_copy_node_a_and_fewer_than_three_are_refused(tmp_path: Path) -> None:
    result = plan("4", tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[3].split()[:3] == ["4", "node-d", "containerd"]
    result = plan("2", tmp_path / "two")
    assert result.returncode == 2 and "3 nodes at least" in result.stderr


def test_bad_entries_are_named(tmp_path: Path) -> None:
    cases = {
        "- {name: a, runtime: docker}": "runtime must be one of containerd, cri-o, got 'docker' @ $[0].runtime",
        "- {name: a}\n- {name: a}": "node 'a' named twice @ $[1].name",
        "- {name: A_b}": "name must be a DNS label",
        "- {name: a, cpu: 2}": "unknown keys ['cpu'] @ $[0]",
        "- {name: a, labels: {x: [1]}}": "@ $[0].labels.x",
        "{name: a}": "must be a non-empty YAML list of nodes",
    }
    for i, (text, message) in enumerate(cases.items()):
        file = tmp_path / f"nodes-{i}.yaml"
        file.write_text(text)
        result = plan(str(file), tmp_path / f"out-{i}")
        assert result.returncode == 2, text
        assert result.stderr.startswith(f"{file}: ") and message in result.stderr, (text, result.stderr)
        assert not (tmp_path / f"out-{i}").exists()
