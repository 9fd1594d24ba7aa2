"""cdiplug's DaemonSet on a real node (``hack/local-cluster.sh``: kubelet, kube-apiserver,
kube-scheduler, controller-manager, containerd 2.x), deployed from ``deploy/overlays/fake`` with the
image built from this tree.

- The DaemonSet runs cdiplug in its container; the node's capacity and allocatable show
  ``example.com/fpga: 2``.
- The seed experiment with ``deploy/examples``: two pods Running with distinct
  ``FAKE_FPGA_DEVICES``, the third Pending with ``Insufficient example.com/fpga`` in its
  PodScheduled condition, from the real scheduler.
- Kubelet restart (SIGKILL, then started again): cdiplug registers again, the running pod keeps its
  container and its device, and a new pod gets the other device.
- cdiplug's pod deleted: the DaemonSet brings a new one, which registers; the resource returns.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from .conftest import seed_experiment

# The first test's setup may bring the node up and build the image (minutes from scratch).
pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "hack" / "local-cluster.sh"
NAMESPACE = "cdiplug-system"
TEST_NAMESPACE = "cdiplug-cluster-test"
FPGA = "example.com/fpga"


def test_fake_overlay_runs_cdiplug_and_the_node_advertises_two_fpgas(kube: Any, cdiplug: dict[str, Any]) -> None:
    (container,) = cdiplug["spec"]["containers"]
    assert container["image"] == "cdiplug:0.1.0"
    (status,) = cdiplug["status"]["containerStatuses"]
    assert status["ready"] and status["restartCount"] == 0
    # The daemon is the container's process 1, and it registered with this node's kubelet.
    cmdline = kube.exec(cdiplug["metadata"]["name"], NAMESPACE, "cat", "/proc/1/cmdline").split("\0")
    assert "/opt/cdiplug/bin/cdiplug" in cmdline[:2] and "serve" in cmdline, cmdline
    logs = [
        json.loads(line)
        for line in kube("logs", "-n", NAMESPACE, cdiplug["metadata"]["name"]).splitlines()
        if line.startswith("{")
    ]
    assert any(entry["message"].startswith(f"registered {FPGA} with the kubelet") for entry in logs), logs
    node = kube.watch(
        f"node/{kube.node}",
        lambda n: n["status"]["capacity"].get(FPGA) == "2" and n["status"]["allocatable"].get(FPGA) == "2",
        what=f"capacity and allocatable {FPGA} = 2",
    )
    assert node["status"]["capacity"][FPGA] == node["status"]["allocatable"][FPGA] == "2"
    # The CDI spec the runtime reads, on the node.
    spec = json.loads(Path("/var/run/cdi/cdiplug-example.com-fpga.json").read_text())
    assert spec["kind"] == FPGA and [d["name"] for d in spec["devices"]] == ["fpga-0", "fpga-1"]


def test_seed_experiment_two_pods_run_on_distinct_devices_the_third_is_pending(kube: Any, cdiplug: dict[str, Any]) -> None:
    seed_experiment(kube)


def test_kubelet_restart_cdiplug_registers_again_and_running_pods_keep_their_devices(
    kube: Any, cdiplug: dict[str, Any], pods: Any
) -> None:
    first = pods("keeps-device", {FPGA: 1})
    device = kube.env_of("keeps-device", TEST_NAMESPACE)["FAKE_FPGA_DEVICES"]
    container_id = first["status"]["containerStatuses"][0]["containerID"]
    daemon = kube.daemon_pod()
    before = kube.metrics(daemon)

    pid = kube.kubelet_pid()
    os.kill(pid, signal.SIGKILL)
    # The process is gone when its /proc entry is (tail --pid waits for that without a loop here).
    subprocess.run(["timeout", "20", "tail", f"--pid={pid}", "-s", "0.1", "-f", "/dev/null"], check=True)
    started = time.monotonic()
    subprocess.run([str(SCRIPT), "start", "kubelet"], check=True, capture_output=True, timeout=60)

    # cdiplug notices the new kubelet socket and registers again. A counter behind HTTP has no
    # watch: a bounded poll with short sleeps.
    deadline = started + 30
    while True:
        now = kube.metrics(daemon)
        if now.get("cdiplug_reregistrations_total", 0) > before.get("cdiplug_reregistrations_total", 0):
            break
        assert time.monotonic() < deadline, f"cdiplug did not register again within 30 s: {now}"
        time.sleep(0.2)
    assert now["cdiplug_kubelet_restarts_total"] == before.get("cdiplug_kubelet_restarts_total", 0) + 1

    # The running pod kept its container and its device; a new pod gets the other one.
    second = pods("after-restart", {FPGA: 1})
    other = kube.env_of("after-restart", TEST_NAMESPACE)["FAKE_FPGA_DEVICES"]
    assert {device, other} == {"fpga-0", "fpga-1"}
    still = kube.get("pod/keeps-device", TEST_NAMESPACE)
    (status,) = still["status"]["containerStatuses"]
    assert status["containerID"] == container_id and status["restartCount"] == 0 and status["ready"]
    assert kube.env_of("keeps-device", TEST_NAMESPACE)["FAKE_FPGA_DEVICES"] == device
    assert second["spec"]["nodeName"] == kube.node
    kube.wait_node("allocatable", FPGA, "2")


def test_daemonset_brings_back_a_deleted_cdiplug_pod_and_the_resource_returns(
    kube: Any, cdiplug: dict[str, Any], pods: Any
) -> None:
    old = kube.daemon_pod()
    kube("delete", "pod", "-n", NAMESPACE, old["metadata"]["name"], "--wait=true", "--timeout=60s", timeout=70)
    new = kube.watch(
        "pods",
        lambda p: (
            p["metadata"]["uid"] != old["metadata"]["uid"] and p["metadata"].get("deletionTimestamp") is None and kube.is_ready(p)
        ),
        what="a new Ready cdiplug pod",
        namespace=NAMESPACE,
        selector="app.kubernetes.io/name=cdiplug",
        timeout=90,
    )
    # Ready means /readyz: every configured resource registered with the kubelet.
    assert kube.metrics(new)["cdiplug_registrations_total"] >= 1
    kube.wait_node("allocatable", FPGA, "2")
    # And the devices can be had again: one pod takes both.
    pods("both-devices", {FPGA: 2})
    assert sorted(kube.env_of("both-devices", TEST_NAMESPACE)["FAKE_FPGA_DEVICES"].split(",")) == ["fpga-0", "fpga-1"]
