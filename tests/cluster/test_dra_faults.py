"""DRA under faults on the real one-node cluster (the faults that need the real thing).

The DRA deployment of tests/cluster/test_dra.py (its ``dra`` and ``apply`` fixtures: cdiplug from
``tests/cluster/overlays/dra``, two fake FPGAs as driver ``fpga.example.com``), with the real
kube-apiserver, kubelet, scheduler and containerd of ``hack/local-cluster.sh``. Covers:

- the control plane's kube-apiserver stopped for 30 s while a pod holds a claim
  (``hack/local-cluster.sh stop|start kube-apiserver``): the pod keeps running with the same
  container, cdiplug's pod is not restarted, and a new pod with a claim runs once it is back;
- kill -9 of the daemon (its process on the node, found by its container's cgroup) while the
  kubelet prepares two claims: the kubelet starts it again, both pods run, and once they are
  deleted neither claim has a CDI spec or a checkpoint record left;
- 50 pods with claims created within 10 s all Running. The deployment has two devices, so the
  pods share two ResourceClaims (25 each: a claim may be reserved for up to 256 pods).

Run by the lead: ``.venv/bin/pytest -m cluster tests/cluster/test_dra_faults.py -x -q``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from .conftest import SCRIPT
from .test_dra import CDI_DIR, DRIVER, LABEL, NAMESPACE, TEST_NAMESPACE, apply, dra, example, one, pod_from, ready

__all__ = ["apply", "dra"]  # the fixtures, shared with test_dra.py

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

STATE = Path("/var/lib/cdiplug/dra-claims.json")
OUTAGE = 30


def daemon_pid(kube: Any) -> int:
    """The host PID of cdiplug's process in its Ready pod (the one whose cgroup names its container)."""
    pod = kube.daemon_pod()
    container = pod["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cgroup = (entry / "cgroup").read_text()
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if container in cgroup and any(b"cdiplug" in part for part in cmdline) and b"serve" in cmdline:
            return int(entry.name)
    raise AssertionError(f"no cdiplug process in container {container}")


def restarts(kube: Any) -> int:
    return int(kube.daemon_pod()["status"]["containerStatuses"][0]["restartCount"])


def claim_uids(kube: Any, pods: list[str]) -> set[str]:
    uids = set()
    for pod in pods:
        status = kube.get(f"pod/{pod}", TEST_NAMESPACE)["status"]
        for s in status.get("resourceClaimStatuses") or []:
            uids.add(kube.get(f"resourceclaim/{s['resourceClaimName']}", TEST_NAMESPACE)["metadata"]["uid"])
    return uids


def checkpointed() -> set[str]:
    return set(json.loads(STATE.read_text())["claims"]) if STATE.exists() else set()


def test_api_server_stopped_30_s_with_a_claim_held(dra: Any, apply: Callable[..., None]) -> None:
    objects = example("one-device.yaml")
    apply(one(objects, "ResourceClaimTemplate"), pod_from(objects, "held"))
    before = ready(dra, "held")["status"]["containerStatuses"][0]["containerID"]
    daemon_restarts = restarts(dra)
    subprocess.run([str(SCRIPT), "stop", "kube-apiserver"], check=True, capture_output=True, timeout=60)
    try:
        time.sleep(OUTAGE)  # the fault is a length of time: nothing to wait on
    finally:
        subprocess.run([str(SCRIPT), "start", "kube-apiserver"], check=True, capture_output=True, timeout=120)
    dra("wait", "--for=condition=Ready", f"node/{dra.node}", "--timeout=120s", timeout=130)
    status = dra.get("pod/held", TEST_NAMESPACE)["status"]
    assert status["phase"] == "Running" and status["containerStatuses"][0]["containerID"] == before
    assert restarts(dra) == daemon_restarts, "cdiplug was restarted while the API server was gone"
    delete_after_restart(dra, "held")
    apply(pod_from(objects, "after-outage"))
    ready(dra, "after-outage", timeout=180)


def delete_after_restart(kube: Any, name: str) -> None:
    """Delete a pod right after the API server's restart.

    Seen here: ``kubectl delete --wait`` timed out after 90 s while the kubelet had removed the pod
    within a second (its watch, opened against the just restarted server, never saw the deletion).
    So: wait by watch, then ask once whether it is gone; that answer decides. Seen too: the
    kubelet's own pod watch listed again only 90 s after the server came back (its log: "Caches
    populated" for ``*v1.Pod``), and it heard of the deletion then, removing the pod within a
    second: the wait allows for that.
    """
    kube("delete", "pod", name, "-n", TEST_NAMESPACE, "--grace-period=1", "--wait=false")
    kube("wait", "--for=delete", f"pod/{name}", "-n", TEST_NAMESPACE, "--timeout=150s", check=False, timeout=160)
    assert not kube("get", "pod", name, "-n", TEST_NAMESPACE, "--ignore-not-found", "-o", "name").strip(), f"{name} not deleted"


def test_kill_9_of_the_daemon_during_two_prepares(dra: Any, apply: Callable[..., None]) -> None:
    objects = example("one-device.yaml")
    pid = daemon_pid(dra)
    daemon_restarts = restarts(dra)
    apply(one(objects, "ResourceClaimTemplate"), pod_from(objects, "kill-a"), pod_from(objects, "kill-b"))
    # Killed once the scheduler has allocated a claim: the kubelet is preparing them now.
    dra.watch(
        "resourceclaims",
        lambda c: bool((c.get("status") or {}).get("allocation")),
        what="an allocated claim",
        namespace=TEST_NAMESPACE,
        timeout=60,
    )
    os.kill(pid, signal.SIGKILL)
    for name in ("kill-a", "kill-b"):
        ready(dra, name, timeout=240)
    assert restarts(dra) == daemon_restarts + 1
    uids = claim_uids(dra, ["kill-a", "kill-b"])
    assert len(uids) == 2 and uids <= checkpointed()
    dra.delete_pods(TEST_NAMESPACE, "kill-a", "kill-b")
    dra("wait", "--for=delete", "resourceclaims", "--all", "-n", TEST_NAMESPACE, "--timeout=90s", timeout=100)
    assert not uids & checkpointed(), "a claim is still in the checkpoint"
    left = [p.name for p in CDI_DIR.glob("cdiplug-claim-*.json") if any(u in p.name for u in uids)]
    assert not left, f"CDI specs left: {left}"


def shared_claim(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": TEST_NAMESPACE, "labels": {LABEL: "true"}},
        "spec": {"devices": {"requests": [{"name": "fpga", "exactly": {"deviceClassName": DRIVER}}]}},
    }


def test_50_pods_with_claims_created_in_10_s_all_run(dra: Any, apply: Callable[..., None]) -> None:
    objects = example("one-device.yaml")
    claims = [shared_claim("load-a"), shared_claim("load-b")]
    pods = []
    for i in range(50):
        pod = pod_from(objects, f"load-{i}")
        pod["spec"]["resourceClaims"] = [{"name": "fpga", "resourceClaimName": claims[i % 2]["metadata"]["name"]}]
        pods.append(pod)
    started = time.monotonic()
    try:
        apply(*claims, *pods)
        assert time.monotonic() - started < 10, "creating the pods took more than 10 s"
        dra("wait", "--for=condition=Ready", "pod", "-l", LABEL, "-n", TEST_NAMESPACE, "--timeout=300s", timeout=320)
        took = time.monotonic() - started
        phases = {p["status"]["phase"] for p in dra.get("pods", TEST_NAMESPACE)["items"]}
        assert phases == {"Running"}, phases
        print(f"50 pods on 2 shared claims Running {took:.1f} s after creation; cdiplug in {NAMESPACE}")
    finally:  # not made for a pod: the resourceclaim controller leaves them (they go once no pod holds them)
        dra("delete", "resourceclaims", "load-a", "load-b", "-n", TEST_NAMESPACE, "--ignore-not-found", "--wait=false")
