"""Sharing and partitions on a real node: cdiplug from the DRA overlay with
``deploy/examples/dra/cdiplug-config.yaml`` (fake FPGAs, shared 80Gi GPUs, a partitioned tile),
the real kubelet, scheduler, resourceclaim controller and containerd of ``hack/local-cluster.sh``.

Covers, each applying its example of ``deploy/examples/dra`` as shipped
(moved into a test namespace, the pods made to stop at once):

- ``capacity.yaml``: three claims of 30Gi on one 80Gi device (gpu-0): two run, each seeing
  ``FAKE_GPU_MEMORY_0=30Gi`` and a share of its own (distinct share IDs in the allocations); the
  third is Unschedulable; when one leaves, the third runs;
- ``partitions.yaml``: the two halves of the tile run; the whole tile is Unschedulable while
  they hold its slices; after both leave, the whole runs on ``tile-0``;
- ``shared-claim.yaml``: two pods on one ResourceClaim see the same device; the claim's CDI spec
  stays while one pod is left and is removed once the second leaves (the kubelet unprepares).

The deployment: a kustomization in a temporary folder over ``tests/cluster/overlays/dra`` (the
DRA overlay on this cluster's network) whose config is the example ConfigMap's ``config.yaml``,
and whose ClusterRole lets the daemon write the claim status of the three drivers. The fake
overlay is put back at the end, as ``test_dra.py`` does. Run by the lead only:
``pytest -m cluster tests/cluster/test_dra_capacity.py``.
"""

from __future__ import annotations

import copy
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from .conftest import wait_for_file

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
TEST_OVERLAY = Path(__file__).resolve().parent / "overlays" / "dra"
FAKE_OVERLAY = REPO / "deploy" / "overlays" / "fake"
DRA_OVERLAY = REPO / "deploy" / "overlays" / "dra"
EXAMPLES = REPO / "deploy" / "examples" / "dra"
NAMESPACE = "cdiplug-system"
TEST_NAMESPACE = "cdiplug-dra-capacity-test"
LABEL = "cdiplug.test/dra-capacity"
DRIVERS = ("fpga.example.com", "gpu.example.com", "tile.example.com")
CDI_DIR = Path("/var/run/cdi")
CLUSTER_SCOPED = {"DeviceClass"}


def kustomization(folder: Path) -> Path:
    """The DRA test overlay with the example config and the claim-status rights of every driver."""
    data = yaml.safe_load((EXAMPLES / "cdiplug-config.yaml").read_text())
    (folder / "config.yaml").write_text(data["data"]["config.yaml"])
    rule = {
        "apiGroups": ["resource.k8s.io"],
        "resources": ["resourceclaims/driver"],
        "resourceNames": list(DRIVERS),
        "verbs": ["associated-node:patch", "associated-node:update"],
    }
    patch = [{"op": "add", "path": "/rules/-", "value": rule}]
    (folder / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "namespace": NAMESPACE,
                "resources": [os.path.relpath(TEST_OVERLAY, folder)],
                "configMapGenerator": [{"name": "cdiplug-config", "behavior": "replace", "files": ["config.yaml"]}],
                "patches": [
                    {"target": {"kind": "ClusterRole", "name": "cdiplug-dra"}, "patch": json.dumps(patch)},
                ],
            }
        )
    )
    return folder


def example(name: str) -> list[dict[str, Any]]:
    """The objects of ``deploy/examples/dra/<name>``, namespaced ones moved into the test namespace."""
    objects = [o for o in yaml.safe_load_all((EXAMPLES / name).read_text()) if o]
    for obj in objects:
        obj["metadata"].setdefault("labels", {})[LABEL] = "true"
        if obj["kind"] in CLUSTER_SCOPED:
            continue
        obj["metadata"]["namespace"] = TEST_NAMESPACE
        if obj["kind"] == "Pod":
            obj["spec"]["terminationGracePeriodSeconds"] = 1
            for c in obj["spec"]["containers"]:
                c["command"] = ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"]
    return objects


def pick(objects: list[dict[str, Any]], *names: str) -> list[dict[str, Any]]:
    return [copy.deepcopy(o) for o in objects if o["kind"] != "Pod" or o["metadata"]["name"] in names]


def unschedulable(kube: Any, pod: str) -> dict[str, Any]:
    return kube.watch(  # type: ignore[no-any-return]
        f"pod/{pod}",
        lambda p: any(
            c["type"] == "PodScheduled" and c["status"] == "False" and c.get("reason") == "Unschedulable"
            for c in p.get("status", {}).get("conditions", [])
        ),
        what=f"{pod} Unschedulable",
        namespace=TEST_NAMESPACE,
        timeout=60,
    )


def ready(kube: Any, pod: str, timeout: float = 120) -> dict[str, Any]:
    return kube.wait_pod_ready(pod, TEST_NAMESPACE, timeout=timeout)  # type: ignore[no-any-return]


def results_of(kube: Any, pod: str) -> list[dict[str, Any]]:
    status = kube.get(f"pod/{pod}", TEST_NAMESPACE)["status"]
    (name,) = [s["resourceClaimName"] for s in status.get("resourceClaimStatuses") or [] if s.get("resourceClaimName")]
    claim = kube.get(f"resourceclaim/{name}", TEST_NAMESPACE)
    return claim["status"]["allocation"]["devices"]["results"]  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def dra(kube: Any) -> Iterator[Any]:
    had_fake = bool(kube("get", "daemonset/cdiplug", "-n", NAMESPACE, "--ignore-not-found", "-o", "name").strip())
    kube("delete", "namespace", TEST_NAMESPACE, "--ignore-not-found", "--wait=true", "--timeout=120s", timeout=150)
    with tempfile.TemporaryDirectory(prefix="cdiplug-dra-capacity-") as folder:
        kube("apply", "--validate=false", "-k", str(kustomization(Path(folder))))
    kube("create", "namespace", TEST_NAMESPACE)
    kube("wait", "--for=create", "serviceaccount/default", "-n", TEST_NAMESPACE, "--timeout=60s", timeout=70)
    kube("rollout", "restart", "-n", NAMESPACE, "daemonset/cdiplug")
    kube("rollout", "status", "-n", NAMESPACE, "daemonset/cdiplug", "--timeout=180s", timeout=190)
    kube.daemon_pod()
    kube.watch(
        "resourceslices",
        lambda s: s["spec"]["driver"] == "tile.example.com" and bool(s["spec"].get("sharedCounters")),
        what="the tile's counter set",
    )
    kube.watch(
        "resourceslices",
        lambda s: s["spec"]["driver"] == "gpu.example.com" and len(s["spec"].get("devices") or []) == 2,
        what="the two shared GPUs",
    )
    yield kube
    kube("delete", "namespace", TEST_NAMESPACE, "--ignore-not-found", "--wait=true", "--timeout=120s", timeout=150)
    for name in ("capacity.yaml", "partitions.yaml"):
        for obj in example(name):
            if obj["kind"] in CLUSTER_SCOPED:
                kube("delete", obj["kind"].lower(), obj["metadata"]["name"], "--ignore-not-found", timeout=60)
    kube("delete", "-f", str(DRA_OVERLAY / "deviceclass.yaml"), "--ignore-not-found", timeout=60)
    if had_fake:
        kube("apply", "--validate=false", "-k", str(FAKE_OVERLAY))
        kube("rollout", "status", "-n", NAMESPACE, "daemonset/cdiplug", "--timeout=180s", timeout=190)
        kube.daemon_pod()
    else:
        kube("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true", "--timeout=120s", timeout=150)
    kube("delete", "-f", str(DRA_OVERLAY / "rbac.yaml"), "--ignore-not-found", timeout=60)


@pytest.fixture
def cleanup(dra: Any) -> Iterator[Any]:
    yield dra
    dra.delete_pods(TEST_NAMESPACE, selector=LABEL)
    for kind in ("resourceclaimtemplates", "resourceclaims"):
        dra("delete", kind, "-n", TEST_NAMESPACE, "-l", LABEL, "--ignore-not-found", "--wait=true", timeout=120)
    dra("wait", "--for=delete", "resourceclaims", "--all", "-n", TEST_NAMESPACE, "--timeout=90s", timeout=100)


def test_three_30gi_claims_on_one_80gi_device(cleanup: Any) -> None:
    kube = cleanup
    objects = example("capacity.yaml")
    kube.apply(pick(objects, "capacity-pod-1", "capacity-pod-2"))
    for pod in ("capacity-pod-1", "capacity-pod-2"):
        ready(kube, pod)
        assert kube.env_of(pod, TEST_NAMESPACE)["FAKE_GPU_MEMORY_0"] == "30Gi"
    shares = [results_of(kube, p)[0] for p in ("capacity-pod-1", "capacity-pod-2")]
    assert {r["device"] for r in shares} == {"gpu-0"}
    assert all(r["consumedCapacity"] == {"memory": "30Gi"} for r in shares)
    assert len({r["shareID"] for r in shares}) == 2  # two shares, two CDI devices
    kube.apply([o for o in pick(objects, "capacity-pod-3") if o["kind"] == "Pod"])
    unschedulable(kube, "capacity-pod-3")  # 60Gi taken: 30Gi more would pass 80Gi
    kube.delete_pods(TEST_NAMESPACE, "capacity-pod-1")
    ready(kube, "capacity-pod-3")
    assert results_of(kube, "capacity-pod-3")[0]["device"] == "gpu-0"


def test_two_halves_run_and_the_whole_waits_until_they_leave(cleanup: Any) -> None:
    kube = cleanup
    objects = example("partitions.yaml")
    kube.apply(pick(objects, "half-tile-pod-1", "half-tile-pod-2"))
    halves = set()
    for pod in ("half-tile-pod-1", "half-tile-pod-2"):
        ready(kube, pod)
        halves.add(kube.env_of(pod, TEST_NAMESPACE)["FAKE_TILE_DEVICES"])
    assert halves == {"tile-0-1of2", "tile-0-2of2"}
    kube.apply([o for o in pick(objects, "whole-tile-pod") if o["kind"] == "Pod"])
    unschedulable(kube, "whole-tile-pod")
    kube.delete_pods(TEST_NAMESPACE, "half-tile-pod-1", "half-tile-pod-2")
    ready(kube, "whole-tile-pod")
    assert kube.env_of("whole-tile-pod", TEST_NAMESPACE)["FAKE_TILE_DEVICES"] == "tile-0"


def test_two_pods_on_one_claim_keep_its_device_until_the_second_leaves(cleanup: Any) -> None:
    kube = cleanup
    kube.apply(example("shared-claim.yaml"))
    envs = []
    for pod in ("shared-claim-pod-1", "shared-claim-pod-2"):
        ready(kube, pod)
        envs.append(kube.env_of(pod, TEST_NAMESPACE)["FAKE_FPGA_DEVICES"])
    assert envs[0] == envs[1] and envs[0] in ("fpga-0", "fpga-1")
    claim = kube.get("resourceclaim/shared-fpga", TEST_NAMESPACE)
    assert len(claim["status"]["reservedFor"]) == 2
    spec = CDI_DIR / f"cdiplug-claim-{claim['metadata']['uid']}.json"
    assert spec.exists()
    kube.delete_pods(TEST_NAMESPACE, "shared-claim-pod-1")
    kube.watch(
        "resourceclaim/shared-fpga",
        lambda c: len(c["status"].get("reservedFor") or []) == 1,
        what="the claim reserved for one pod",
        namespace=TEST_NAMESPACE,
    )
    assert spec.exists() and kube.env_of("shared-claim-pod-2", TEST_NAMESPACE)["FAKE_FPGA_DEVICES"] == envs[0]
    kube.delete_pods(TEST_NAMESPACE, "shared-claim-pod-2")
    wait_for_file(spec, present=False)
