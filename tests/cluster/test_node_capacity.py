"""``cdiplug node-capacity set|remove`` (seed 001) against the real kube-apiserver: the capacity
appears in the node's status (and the kubelet copies it into allocatable), then goes away. The
command runs from this working tree with the cluster's kubeconfig (an admin token).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

# The first test's setup may bring the node up and build the image (minutes from scratch).
pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
DONGLE = "example.com/dongle"


def node_capacity(kube: Any, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**kube.env, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "cdiplug", "node-capacity", *args, "--kubeconfig", str(kube.kubeconfig)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def test_node_capacity_set_and_remove(kube: Any) -> None:
    result = node_capacity(kube, "set", kube.node, f"{DONGLE}=4")
    assert result.returncode == 0, result.stderr
    try:
        path = "{.status.capacity.example\\.com/dongle}"
        assert kube("get", "node", kube.node, "-o", f"jsonpath={path}") == "4"
        kube.wait_node("allocatable", DONGLE, "4")
    finally:
        result = node_capacity(kube, "remove", kube.node, DONGLE)
    assert result.returncode == 0, result.stderr
    assert kube("get", "node", kube.node, "-o", f"jsonpath={path}") == ""
    node = kube.wait_node("allocatable", DONGLE, None)
    assert DONGLE not in node["status"]["capacity"]
