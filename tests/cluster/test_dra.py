"""DRA on a real node: cdiplug from ``deploy/overlays/dra`` serving ``example.com/fpga`` as the DRA
driver ``fpga.example.com`` (and a dongle as a device plugin from the same process),
with the real kubelet, scheduler, resourceclaim controller and containerd (CDI) of
``hack/local-cluster.sh``.

Covers: the ResourceSlice with the right devices and typed attributes;
a pod with a ResourceClaimTemplate runs with its device's env from the per-claim CDI spec, a
second pod gets the other device, a third waits Pending; deleting a pod unprepares it (spec gone,
the device goes to the pending pod); restarting cdiplug while pods run keeps them and the next pod
still works; the ``firstAvailable`` example picks the fast device first and falls back; the
DeviceClass ``extendedResourceName`` path runs a classic pod through DRA; a device turned
Unhealthy is tainted in the slice and the pod's status shows it; the dongle is a device plugin
beside the DRA driver.

The DRA deployment (``tests/cluster/overlays/dra``: the DRA overlay on the node's network, as this
cluster's API server listens on loopback only) replaces the fake overlay's for this module (same
namespace, the DaemonSet updated in place) and the fake overlay is put back at the end, so the other cluster tests find it
as they left it. Test pods, claims and templates live in their own namespace and are deleted
after each test, waiting until the kubelet has unprepared them.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from .conftest import HEALTH_FILE, wait_for_file, write_health

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
DRA_OVERLAY = REPO / "deploy" / "overlays" / "dra"
# deploy/overlays/dra plus the node's network to reach this cluster's API server (see its kustomization)
TEST_OVERLAY = Path(__file__).resolve().parent / "overlays" / "dra"
FAKE_OVERLAY = REPO / "deploy" / "overlays" / "fake"
EXAMPLES = REPO / "deploy" / "examples" / "dra"
NAMESPACE = "cdiplug-system"
TEST_NAMESPACE = "cdiplug-dra-test"
LABEL = "cdiplug.test/dra"
DRIVER = "fpga.example.com"
CDI_DIR = Path("/var/run/cdi")
DONGLE = "example.com/dra-dongle"  # the test overlay's name for the overlay's example.com/dongle


def example(name: str) -> list[dict[str, Any]]:
    """The objects of ``deploy/examples/dra/<name>``, moved into the test namespace and labelled."""
    objects = [o for o in yaml.safe_load_all((EXAMPLES / name).read_text()) if o]
    for obj in objects:
        obj["metadata"]["namespace"] = TEST_NAMESPACE
        obj["metadata"].setdefault("labels", {})[LABEL] = "true"
        if obj["kind"] == "Pod":
            spec = obj["spec"]
            spec["terminationGracePeriodSeconds"] = 1
            for c in spec["containers"]:
                c["command"] = ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"]
    return objects


def one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"{kind} {name}: {len(found)}"
    return copy.deepcopy(found[0])


def pod_from(objects: list[dict[str, Any]], name: str, template_pod: str | None = None) -> dict[str, Any]:
    pod = one(objects, "Pod", template_pod)
    pod["metadata"]["name"] = name
    return pod


def slices(kube: Any) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = kube.get("resourceslices")["items"]
    return [s for s in items if s["spec"]["driver"] == DRIVER]


def claim_of(kube: Any, pod: str) -> dict[str, Any]:
    """The ResourceClaim made for the pod (from its template, or for its extended resource)."""
    status = kube.get(f"pod/{pod}", TEST_NAMESPACE)["status"]
    names = [s["resourceClaimName"] for s in status.get("resourceClaimStatuses") or [] if s.get("resourceClaimName")]
    ext = (status.get("extendedResourceClaimStatus") or {}).get("resourceClaimName")
    (name,) = names or [ext]
    claim: dict[str, Any] = kube.get(f"resourceclaim/{name}", TEST_NAMESPACE)
    return claim


def devices_of(claim: dict[str, Any]) -> list[str]:
    return [r["device"] for r in claim["status"]["allocation"]["devices"]["results"] if r["driver"] == DRIVER]


def fpga_env(kube: Any, pod: str) -> str | None:
    env: dict[str, str] = kube.env_of(pod, TEST_NAMESPACE)
    return env.get("FAKE_FPGA_DEVICES")


def ready(kube: Any, name: str, timeout: float = 120) -> dict[str, Any]:
    pod: dict[str, Any] = kube.wait_pod_ready(name, TEST_NAMESPACE, timeout=timeout)
    return pod


def is_unschedulable(pod: dict[str, Any]) -> bool:
    return any(
        c["type"] == "PodScheduled" and c["status"] == "False" and c.get("reason") == "Unschedulable"
        for c in pod.get("status", {}).get("conditions", [])
    )


@pytest.fixture(scope="module")
def dra(kube: Any) -> Iterator[Any]:
    """cdiplug from deploy/overlays/dra, Ready, with its slice published; the fake overlay back after."""
    had_fake = bool(kube("get", "daemonset/cdiplug", "-n", NAMESPACE, "--ignore-not-found", "-o", "name").strip())
    HEALTH_FILE.unlink(missing_ok=True)
    kube("delete", "namespace", TEST_NAMESPACE, "--ignore-not-found", "--wait=true", "--timeout=120s", timeout=150)
    kube("apply", "--validate=false", "-k", str(TEST_OVERLAY))
    kube("create", "namespace", TEST_NAMESPACE)
    kube("wait", "--for=create", "serviceaccount/default", "-n", TEST_NAMESPACE, "--timeout=60s", timeout=70)
    # A fresh pod: one left by an earlier session may run an older build of the same image tag.
    kube("rollout", "restart", "-n", NAMESPACE, "daemonset/cdiplug")
    kube("rollout", "status", "-n", NAMESPACE, "daemonset/cdiplug", "--timeout=180s", timeout=190)
    kube.daemon_pod()  # Ready: /readyz counts the DRA driver registered with the kubelet
    kube.watch(
        "resourceslices",
        lambda s: s["spec"]["driver"] == DRIVER and len(s["spec"].get("devices") or []) == 2,
        what="the fpga.example.com slice with two devices",
    )
    yield kube
    HEALTH_FILE.unlink(missing_ok=True)
    kube("delete", "namespace", TEST_NAMESPACE, "--ignore-not-found", "--wait=true", "--timeout=120s", timeout=150)
    kube("delete", "-f", str(DRA_OVERLAY / "deviceclass.yaml"), "--ignore-not-found", timeout=60)
    if had_fake:
        kube("apply", "--validate=false", "-k", str(FAKE_OVERLAY))
        kube("rollout", "status", "-n", NAMESPACE, "daemonset/cdiplug", "--timeout=180s", timeout=190)
        kube.daemon_pod()
    else:
        kube("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true", "--timeout=120s", timeout=150)
    kube("delete", "-f", str(DRA_OVERLAY / "rbac.yaml"), "--ignore-not-found", timeout=60)


@pytest.fixture
def apply(dra: Any) -> Iterator[Callable[..., None]]:
    """``apply(objects)``; every labelled object of the test namespace is deleted after the test."""

    def make(*objects: dict[str, Any]) -> None:
        dra.apply(list(objects))

    yield make
    dra.delete_pods(TEST_NAMESPACE, selector=LABEL)
    dra("delete", "resourceclaimtemplates", "-n", TEST_NAMESPACE, "-l", LABEL, "--ignore-not-found", "--wait=true", timeout=120)
    # The claims made for the pods go with them (the resourceclaim controller): every device free.
    dra("wait", "--for=delete", "resourceclaims", "--all", "-n", TEST_NAMESPACE, "--timeout=90s", timeout=100)
    dra.watch(
        "resourceslices",
        lambda s: s["spec"]["driver"] == DRIVER and not any(d.get("taints") for d in s["spec"].get("devices") or []),
        what="the slice without taints",
    )


def test_slice_publishes_the_devices_with_typed_attributes(dra: Any) -> None:
    (s,) = slices(dra)
    spec = s["spec"]
    assert spec["nodeName"] == dra.node
    assert spec["pool"]["name"] == dra.node and spec["pool"]["resourceSliceCount"] == 1 and spec["pool"]["generation"] >= 1
    devices = {d["name"]: d["attributes"] for d in spec["devices"]}
    assert devices == {
        "fpga-0": {"id": {"string": "fpga-0"}, "model": {"string": "fake fpga"}, "speed": {"int": 1}},
        "fpga-1": {"id": {"string": "fpga-1"}, "model": {"string": "fake fpga"}, "speed": {"int": 9}},
    }
    assert s["metadata"]["ownerReferences"][0]["kind"] == "Node"
    # One process, both APIs: the dongle is a device plugin beside the DRA driver. The kubelet
    # puts its device count into the node's status on its own schedule (after a restart of the
    # pod it shows 0 until then): waited for, not read once.
    dra.wait_node("allocatable", DONGLE, "1", timeout=30)
    # No device plugin serves the FPGAs (the kubelet keeps a gone plugin's resource at 0).
    assert dra.get(f"node/{dra.node}")["status"]["allocatable"].get("example.com/fpga", "0") == "0"


def test_claims_get_distinct_devices_and_the_third_waits(dra: Any, apply: Callable[..., None]) -> None:
    objects = example("one-device.yaml")
    apply(one(objects, "ResourceClaimTemplate"), pod_from(objects, "claim-a"), pod_from(objects, "claim-b"))
    a, b = (ready(dra, name) for name in ("claim-a", "claim-b"))
    got = {fpga_env(dra, "claim-a"), fpga_env(dra, "claim-b")}
    assert got == {"fpga-0", "fpga-1"}, got
    claim_a = claim_of(dra, "claim-a")
    assert devices_of(claim_a) == [fpga_env(dra, "claim-a")]
    spec_file = CDI_DIR / f"cdiplug-claim-{claim_a['metadata']['uid']}.json"
    assert spec_file.exists() and spec_file.stat().st_mode & 0o777 == 0o644
    assert a["status"]["phase"] == b["status"]["phase"] == "Running"

    apply(pod_from(objects, "claim-c"))
    dra.watch("pod/claim-c", is_unschedulable, namespace=TEST_NAMESPACE, what="claim-c Pending: no device left")

    dra.delete_pods(TEST_NAMESPACE, "claim-a")
    wait_for_file(spec_file, present=False)  # unprepared: the claim's spec is gone
    ready(dra, "claim-c")
    assert fpga_env(dra, "claim-c") == devices_of(claim_a)[0]  # the freed device is used again


def test_restart_keeps_running_pods_and_serves_the_next(dra: Any, apply: Callable[..., None]) -> None:
    objects = example("one-device.yaml")
    apply(one(objects, "ResourceClaimTemplate"), pod_from(objects, "keep-a"), pod_from(objects, "keep-b"))
    for name in ("keep-a", "keep-b"):
        ready(dra, name)
    before = {
        n: dra.get(f"pod/{n}", TEST_NAMESPACE)["status"]["containerStatuses"][0]["containerID"] for n in ("keep-a", "keep-b")
    }
    old = dra.daemon_pod()["metadata"]["name"]
    dra("delete", "pod", "-n", NAMESPACE, old, "--wait=true", "--timeout=90s", timeout=100)
    dra.watch(
        "pods",
        lambda p: p["metadata"]["name"] != old and dra.is_ready(p),
        what="a new Ready cdiplug pod",
        namespace=NAMESPACE,
        selector="app.kubernetes.io/name=cdiplug",
        timeout=120,
    )
    for name, container in before.items():
        status = dra.get(f"pod/{name}", TEST_NAMESPACE)["status"]
        assert status["phase"] == "Running" and status["containerStatuses"][0]["containerID"] == container
    freed = fpga_env(dra, "keep-a")
    dra.delete_pods(TEST_NAMESPACE, "keep-a")  # unprepared by the new daemon, from its checkpoint
    apply(pod_from(objects, "keep-c"))
    ready(dra, "keep-c")
    assert fpga_env(dra, "keep-c") == freed


def test_first_available_picks_the_fast_device_first(dra: Any, apply: Callable[..., None]) -> None:
    objects = example("fastest.yaml")
    apply(one(objects, "ResourceClaimTemplate"), pod_from(objects, "fast-1", "dra-fastest-1"))
    ready(dra, "fast-1")
    assert fpga_env(dra, "fast-1") == "fpga-1"  # speed 9
    (result,) = claim_of(dra, "fast-1")["status"]["allocation"]["devices"]["results"]
    assert result["request"] == "fpga/fast"
    apply(pod_from(objects, "fast-2", "dra-fastest-2"))
    ready(dra, "fast-2")
    assert fpga_env(dra, "fast-2") == "fpga-0"  # fell back
    (result,) = claim_of(dra, "fast-2")["status"]["allocation"]["devices"]["results"]
    assert result["request"] == "fpga/any"


def test_extended_resource_name_runs_a_classic_pod_through_dra(dra: Any, apply: Callable[..., None]) -> None:
    objects = example("extended-resource.yaml")
    apply(pod_from(objects, "classic"))
    ready(dra, "classic")
    device = fpga_env(dra, "classic")
    assert device in ("fpga-0", "fpga-1")
    assert devices_of(claim_of(dra, "classic")) == [device]  # a claim, made by the scheduler


def test_unhealthy_device_is_tainted_and_shown_in_the_pod(dra: Any, apply: Callable[..., None]) -> None:
    objects = example("one-device.yaml")
    apply(one(objects, "ResourceClaimTemplate"), pod_from(objects, "sick"))
    ready(dra, "sick")
    device = fpga_env(dra, "sick")
    try:
        write_health(f"{device}: Unhealthy\n")
        s = dra.watch(
            "resourceslices",
            lambda s: s["spec"]["driver"] == DRIVER and any(d.get("taints") for d in s["spec"]["devices"]),
            what=f"{device} tainted in the slice",
        )
        taints = {d["name"]: d.get("taints") for d in s["spec"]["devices"]}
        assert [(t["key"], t["effect"]) for t in taints[device]] == [("cdiplug.dev/unhealthy", "NoSchedule")]
        assert not [n for n, t in taints.items() if t and n != device]

        def unhealthy(pod: dict[str, Any]) -> bool:
            statuses = pod["status"].get("containerStatuses") or []
            return any(
                r.get("health") == "Unhealthy"
                for c in statuses
                for entry in c.get("allocatedResourcesStatus") or []
                for r in entry.get("resources") or []
            )

        dra.watch("pod/sick", unhealthy, namespace=TEST_NAMESPACE, what="the pod's allocatedResourcesStatus Unhealthy")
    finally:
        HEALTH_FILE.unlink(missing_ok=True)
