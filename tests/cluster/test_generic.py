"""The generic backend on a real node: cdiplug (the DRA test overlay, with a configuration of the
generic backend and the node's /dev and /sys mounted read-only) serving

- ``example.com/gfuse``: ``/dev/fuse`` shared by ``count: 2`` pods through the device plugin: two
  pods run and open the node inside their container, a third stays Pending;
- ``example.com/gnull``: ``/dev/null`` as the DRA driver ``gnull.example.com``: a pod with a claim
  for it runs and opens the node, placed at ``/dev/claimed-null`` by the claim's ``GenericConfig``.

With the real kubelet, scheduler, resourceclaim controller and containerd (CDI) of
``hack/local-cluster.sh``. The fake overlay is put back at the end, as ``test_dra.py`` does. Run
by the lead only: ``pytest -m cluster tests/cluster/test_generic.py``.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
TEST_OVERLAY = HERE / "overlays" / "dra"
FAKE_OVERLAY = REPO / "deploy" / "overlays" / "fake"
DRA_OVERLAY = REPO / "deploy" / "overlays" / "dra"
NAMESPACE = "cdiplug-system"
TEST_NAMESPACE = "cdiplug-generic-test"
LABEL = "cdiplug.test/generic"
FUSE, NULL, DRIVER = "example.com/gfuse", "example.com/gnull", "gnull.example.com"
CONFIG = {
    "resources": [
        {"name": FUSE, "backend": "generic", "options": {"groups": [{"paths": [{"path": "/dev/fuse"}], "count": 2}]}},
        {"name": NULL, "backend": "generic", "api": "dra", "options": {"groups": [{"paths": [{"path": "/dev/null"}]}]}},
    ]
}
# Opens the node read-write inside the container, then stays (a Ready pod has opened it).
OPEN = "trap 'exit 0' TERM; (exec 3<>{node}) && echo OPENED {node} && touch /tmp/opened; sleep 3600 & wait"


def kustomization(folder: Path) -> Path:
    (folder / "config.yaml").write_text(yaml.safe_dump(CONFIG))
    rule = {
        "apiGroups": ["resource.k8s.io"],
        "resources": ["resourceclaims/driver"],
        "resourceNames": [DRIVER],
        "verbs": ["associated-node:patch", "associated-node:update"],
    }
    (folder / "rbac-patch.yaml").write_text(yaml.safe_dump([{"op": "add", "path": "/rules/-", "value": rule}]))
    device_class = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": DRIVER},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
    }
    (folder / "deviceclass.yaml").write_text(yaml.safe_dump(device_class))
    overlay = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": NAMESPACE,
        "resources": [str(TEST_OVERLAY), "deviceclass.yaml"],
        "configMapGenerator": [{"name": "cdiplug-config", "behavior": "replace", "files": ["config.yaml"]}],
        "patches": [
            {"path": str(HERE / "overlays" / "generic" / "daemonset-patch.yaml")},
            {"path": "rbac-patch.yaml", "target": {"kind": "ClusterRole", "name": "cdiplug-dra"}},
        ],
    }
    (folder / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    return folder


def pod(name: str, node: str, *, limits: dict[str, str] | None = None, claim: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 1,
        "containers": [
            {
                "name": "main",
                "image": "busybox:1.36",
                "command": ["sh", "-c", OPEN.format(node=node)],
                "readinessProbe": {"exec": {"command": ["test", "-e", "/tmp/opened"]}, "periodSeconds": 1},
                "resources": {"limits": limits or {}} | ({"claims": [{"name": "null"}]} if claim else {}),
            }
        ],
    }
    if claim:
        spec["resourceClaims"] = [{"name": "null", "resourceClaimTemplateName": "gnull"}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": TEST_NAMESPACE, "labels": {LABEL: "true"}},
        "spec": spec,
    }


CLAIM_TEMPLATE = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaimTemplate",
    "metadata": {"name": "gnull", "namespace": TEST_NAMESPACE, "labels": {LABEL: "true"}},
    "spec": {
        "spec": {
            "devices": {
                "requests": [{"name": "null", "exactly": {"deviceClassName": DRIVER}}],
                "config": [
                    {
                        "requests": ["null"],
                        "opaque": {
                            "driver": DRIVER,
                            "parameters": {
                                "apiVersion": "cdiplug.dev/v1alpha1",
                                "kind": "GenericConfig",
                                "container_paths": {"/dev/null": "/dev/claimed-null"},
                            },
                        },
                    }
                ],
            }
        }
    },
}


@pytest.fixture(scope="module")
def generic(kube: Any) -> Iterator[Any]:
    had_fake = bool(kube("get", "daemonset/cdiplug", "-n", NAMESPACE, "--ignore-not-found", "-o", "name").strip())
    kube("delete", "namespace", TEST_NAMESPACE, "--ignore-not-found", "--wait=true", "--timeout=120s", timeout=150)
    with tempfile.TemporaryDirectory(prefix="cdiplug-generic-") as folder:
        kube("apply", "--validate=false", "-k", str(kustomization(Path(folder))))
    kube("create", "namespace", TEST_NAMESPACE)
    kube("wait", "--for=create", "serviceaccount/default", "-n", TEST_NAMESPACE, "--timeout=60s", timeout=70)
    kube("rollout", "restart", "-n", NAMESPACE, "daemonset/cdiplug")
    kube("rollout", "status", "-n", NAMESPACE, "daemonset/cdiplug", "--timeout=180s", timeout=190)
    kube.daemon_pod()
    yield kube
    kube("delete", "namespace", TEST_NAMESPACE, "--ignore-not-found", "--wait=true", "--timeout=120s", timeout=150)
    kube("delete", "deviceclass", DRIVER, "--ignore-not-found", timeout=60)
    kube("delete", "-f", str(DRA_OVERLAY / "deviceclass.yaml"), "--ignore-not-found", timeout=60)
    if had_fake:
        kube("apply", "--validate=false", "-k", str(FAKE_OVERLAY))
        kube("rollout", "status", "-n", NAMESPACE, "daemonset/cdiplug", "--timeout=180s", timeout=190)
        kube.daemon_pod()
    else:
        kube("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true", "--timeout=120s", timeout=150)
    kube("delete", "-f", str(DRA_OVERLAY / "rbac.yaml"), "--ignore-not-found", timeout=60)


def test_fuse_is_shared_by_count_pods_and_one_more_waits(generic: Any) -> None:
    kube = generic
    kube.wait_node("allocatable", FUSE, "2")
    try:
        for name in ("fuse-a", "fuse-b"):
            kube.apply(pod(name, "/dev/fuse", limits={FUSE: "1"}))
        for name in ("fuse-a", "fuse-b"):
            kube.wait_pod_ready(name, TEST_NAMESPACE, timeout=120)
            assert "OPENED /dev/fuse" in kube("logs", name, "-n", TEST_NAMESPACE)
        kube.apply(pod("fuse-c", "/dev/fuse", limits={FUSE: "1"}))
        kube.watch(
            "pod/fuse-c",
            lambda p: any(
                c["type"] == "PodScheduled" and c["status"] == "False" for c in p.get("status", {}).get("conditions", [])
            ),
            what="fuse-c Pending",
            namespace=TEST_NAMESPACE,
            timeout=60,
        )
    finally:
        kube.delete_pods(TEST_NAMESPACE, selector=LABEL)


def test_a_claim_for_a_generic_device_opens_its_node_where_the_claim_puts_it(generic: Any) -> None:
    kube = generic
    kube.watch(
        "resourceslices",
        lambda s: s["spec"]["driver"] == DRIVER and len(s["spec"].get("devices") or []) == 1,
        what="the null device's slice",
    )
    try:
        kube.apply([CLAIM_TEMPLATE, pod("null-claim", "/dev/claimed-null", claim=True)])
        kube.wait_pod_ready("null-claim", TEST_NAMESPACE, timeout=120)
        assert "OPENED /dev/claimed-null" in kube("logs", "null-claim", "-n", TEST_NAMESPACE)
    finally:
        kube.delete_pods(TEST_NAMESPACE, selector=LABEL)
        kube("delete", "resourceclaimtemplates", "-n", TEST_NAMESPACE, "-l", LABEL, "--ignore-not-found", timeout=60)
