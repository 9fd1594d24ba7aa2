"""DRA in production on a real node: cdiplug from ``deploy/overlays/dra`` exactly as shipped (pod
network, ``maxSurge: 1``, sockets named with the pod UID, its RBAC and admission policy), with the
real kubelet, scheduler, resourceclaim controller and containerd of ``hack/local-cluster.sh``.
``tests/cluster/overlays/dra-production`` changes only the configuration: 12 fake FPGAs with
``device_metadata: true``. The pods reach the API server through the ``kubernetes`` Service.

Covers: the claim's device status (KEP-4817) as ``kubectl get resourceclaim`` shows it, our entry
gone after the pod leaves; the KEP-5304 metadata file read inside the container; a health change
reaching the pod's ``allocatedResourcesStatus`` within 2 s, the device tainted for its cause
(``cdiplug.dev/thermal=85C``) and untainted when it recovers; a reboot as the node sees it (the CDI folder wiped, cdiplug started
again): the claim's spec is back and a restarted container gets its device; a rolling update to a
new image tag while a claim's pod runs and a new claim's pod is made every second: no failed
prepare, every pod Running, the running pod keeps its container and device. Test objects live in
their own namespace; the fake overlay is put back at the end.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import HEALTH_FILE, stream_pods, wait_for_file, write_health

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "hack" / "local-cluster.sh"
OVERLAY = Path(__file__).resolve().parent / "overlays" / "dra-production"
DRA_OVERLAY = REPO / "deploy" / "overlays" / "dra"
FAKE_OVERLAY = REPO / "deploy" / "overlays" / "fake"
NAMESPACE = "cdiplug-system"
TEST_NAMESPACE = "cdiplug-dra-production-test"
LABEL = "cdiplug.test/dra-production"
DRIVER = "fpga.example.com"
DEVICES = 12
MIN_DURING = 5  # claim pods made while the daemon's update runs (and after it)
CDI_DIR = Path("/var/run/cdi")
METADATA_DIR = "/var/run/kubernetes.io/dra-device-attributes"


def labelled(obj: dict[str, Any]) -> dict[str, Any]:
    obj["metadata"].update(namespace=TEST_NAMESPACE, labels={LABEL: "true"})
    return obj


def template(name: str = "one-fpga") -> dict[str, Any]:
    spec = {"devices": {"requests": [{"name": "fpga", "exactly": {"deviceClassName": DRIVER}}]}}
    return labelled(
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": name}, "spec": {"spec": spec}}
    )


def claim(name: str) -> dict[str, Any]:
    spec = {"devices": {"requests": [{"name": "fpga", "exactly": {"deviceClassName": DRIVER}}]}}
    return labelled({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name}, "spec": spec})


def pod(name: str, *, from_template: str | None = None, from_claim: str | None = None, restart: str = "Never") -> dict[str, Any]:
    """A busybox pod using one FPGA claim (pod claim name ``fpga``), stopping at once on SIGTERM."""
    source = {"resourceClaimTemplateName": from_template} if from_template else {"resourceClaimName": from_claim}
    container = {
        "name": "main",
        "image": "busybox:1.36",
        "command": ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"],
        "resources": {"claims": [{"name": "fpga"}]},
    }
    spec = {
        "restartPolicy": restart,
        "terminationGracePeriodSeconds": 1,
        "resourceClaims": [{"name": "fpga", **source}],
        "containers": [container],
    }
    return labelled({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec})


def ready(kube: Any, name: str, timeout: float = 120) -> dict[str, Any]:
    found: dict[str, Any] = kube.wait_pod_ready(name, TEST_NAMESPACE, timeout=timeout)
    return found


def fpga_of(kube: Any, name: str) -> str | None:
    return kube.env_of(name, TEST_NAMESPACE).get("FAKE_FPGA_DEVICES")  # type: ignore[no-any-return]


def claim_of(kube: Any, name: str) -> dict[str, Any]:
    status = kube.get(f"pod/{name}", TEST_NAMESPACE)["status"]
    (claim_name,) = [s["resourceClaimName"] for s in status["resourceClaimStatuses"]]
    found: dict[str, Any] = kube.get(f"resourceclaim/{claim_name}", TEST_NAMESPACE)
    return found


def ours(claim_obj: dict[str, Any]) -> list[dict[str, Any]]:
    """Our driver's entries of the claim's ``status.devices``."""
    return [d for d in claim_obj.get("status", {}).get("devices") or [] if d["driver"] == DRIVER]


def health_of(found: dict[str, Any]) -> set[str]:
    """The health of every device the pod's containers hold (``allocatedResourcesStatus``)."""
    return {
        r.get("health", "")
        for c in found.get("status", {}).get("containerStatuses") or []
        for entry in c.get("allocatedResourcesStatus") or []
        for r in entry.get("resources") or []
    }


def slice_taints(kube: Any) -> dict[str, list[dict[str, Any]]]:
    (s,) = [s for s in kube.get("resourceslices")["items"] if s["spec"]["driver"] == DRIVER]
    return {d["name"]: d.get("taints") or [] for d in s["spec"]["devices"]}


@pytest.fixture(scope="module")
def prod(kube: Any) -> Iterator[Any]:
    """cdiplug from the production DRA overlay, Ready, its slice published; the fake overlay back after."""
    had_fake = bool(kube("get", "daemonset/cdiplug", "-n", NAMESPACE, "--ignore-not-found", "-o", "name").strip())
    HEALTH_FILE.unlink(missing_ok=True)
    kube("delete", "namespace", TEST_NAMESPACE, "--ignore-not-found", "--wait=true", "--timeout=120s", timeout=150)
    kube("apply", "--validate=false", "-k", str(OVERLAY))
    kube("create", "namespace", TEST_NAMESPACE)
    kube("wait", "--for=create", "serviceaccount/default", "-n", TEST_NAMESPACE, "--timeout=60s", timeout=70)
    kube("rollout", "restart", "-n", NAMESPACE, "daemonset/cdiplug")  # a pod of the image just built
    kube("rollout", "status", "-n", NAMESPACE, "daemonset/cdiplug", "--timeout=180s", timeout=190)
    kube.daemon_pod()
    kube.watch(
        "resourceslices",
        lambda s: s["spec"]["driver"] == DRIVER and len(s["spec"].get("devices") or []) == DEVICES,
        what=f"the {DRIVER} slice with {DEVICES} devices",
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
def apply(prod: Any) -> Iterator[Callable[..., None]]:
    """``apply(objects)``; every labelled object of the test namespace is deleted after the test."""
    yield lambda *objects: prod.apply(list(objects))
    HEALTH_FILE.unlink(missing_ok=True)
    prod.delete_pods(TEST_NAMESPACE, selector=LABEL)
    for kind in ("resourceclaimtemplates", "resourceclaims"):
        prod("delete", kind, "-n", TEST_NAMESPACE, "-l", LABEL, "--ignore-not-found", "--wait=true", timeout=120)
    prod("wait", "--for=delete", "resourceclaims", "--all", "-n", TEST_NAMESPACE, "--timeout=90s", timeout=100)


def test_the_claim_shows_our_device_status_until_its_pod_leaves(prod: Any, apply: Callable[..., None]) -> None:
    apply(claim("held"), pod("user", from_claim="held"))
    ready(prod, "user")
    device = fpga_of(prod, "user")
    found = prod.watch("resourceclaim/held", lambda c: bool(ours(c)), namespace=TEST_NAMESPACE, what="our device status")
    (entry,) = ours(found)
    assert (entry["pool"], entry["device"]) == (prod.node, device)
    (condition,) = entry["conditions"]
    assert (condition["type"], condition["status"], condition["reason"]) == ("Ready", "True", "Prepared")
    assert entry["data"]["id"] == device and entry["data"]["numaNodes"] == [0]
    shown = prod("get", "resourceclaim", "held", "-n", TEST_NAMESPACE, "-o", "yaml")
    assert f"driver: {DRIVER}" in shown and f"device: {device}" in shown
    prod.delete_pods(TEST_NAMESPACE, "user")
    prod.watch("resourceclaim/held", lambda c: not ours(c), namespace=TEST_NAMESPACE, what="our status cleared after unprepare")


def test_device_metadata_is_read_inside_the_container(prod: Any, apply: Callable[..., None]) -> None:
    apply(template(), pod("reader", from_template="one-fpga"))
    ready(prod, "reader")
    device = fpga_of(prod, "reader")
    path = f"{METADATA_DIR}/resourceclaimtemplates/fpga/fpga/{DRIVER}-metadata.json"
    meta = json.loads(prod.exec("reader", TEST_NAMESPACE, "cat", path))
    made = claim_of(prod, "reader")["metadata"]
    assert (meta["kind"], meta["apiVersion"]) == ("DeviceMetadata", "metadata.resource.k8s.io/v1alpha1")
    assert (meta["metadata"]["name"], meta["metadata"]["uid"], meta["podClaimName"]) == (made["name"], made["uid"], "fpga")
    ((request, (entry,)),) = [(r["name"], r["devices"]) for r in meta["requests"]]
    assert (request, entry["name"], entry["driver"], entry["pool"]) == ("fpga", device, DRIVER, prod.node)
    assert entry["attributes"]["id"] == {"string": device}
    assert "rw" not in prod.exec("reader", TEST_NAMESPACE, "sh", "-c", f"grep ' {METADATA_DIR}/' /proc/mounts").split()[3].split(
        ","
    )


def test_a_health_change_reaches_the_pod_within_2_s_and_a_recovery_untaints(prod: Any, apply: Callable[..., None]) -> None:
    apply(template(), pod("sick", from_template="one-fpga"))
    ready(prod, "sick")
    device = fpga_of(prod, "sick")
    # The kubelet shows Unknown until the driver's health stream has spoken of the device.
    prod.watch(
        "pod/sick",
        lambda found: health_of(found) == {"Healthy"},
        namespace=TEST_NAMESPACE,
        what="the pod's device Healthy",
        timeout=30,
    )

    def timed_change(text: str, want: str) -> float:
        """Seconds from writing the health file to the pod's status showing ``want`` (watch first, then write)."""
        watching, seen = threading.Event(), [0.0]
        problems: list[BaseException] = []

        def predicate(found: dict[str, Any]) -> bool:
            watching.set()
            if health_of(found) == {want}:
                seen[0] = time.monotonic()
                return True
            return False

        def run() -> None:
            try:
                prod.watch("pod/sick", predicate, namespace=TEST_NAMESPACE, what=f"the pod's device {want}", timeout=60)
            except BaseException as exc:  # raised again on the test's thread
                problems.append(exc)

        thread = threading.Thread(target=run)
        thread.start()
        assert watching.wait(30), "the watch never started"
        written = time.monotonic()
        write_health(text)
        thread.join(90)
        if problems:
            raise problems[0]
        return seen[0] - written

    took = timed_change(f"{device}: Unhealthy thermal=85C\n", "Unhealthy")  # a cause: its own taint
    # ResourceHealthStatusMessage (beta, on in 1.36): the kubelet shows our message, the cause named.
    messages = [
        r.get("message", "")
        for c in prod.get("pod/sick", TEST_NAMESPACE)["status"]["containerStatuses"]
        for entry in c.get("allocatedResourcesStatus") or []
        for r in entry.get("resources") or []
    ]
    assert any("thermal" in m for m in messages), messages
    taints = prod.watch(
        "resourceslices",
        lambda s: s["spec"]["driver"] == DRIVER and any(d.get("taints") for d in s["spec"]["devices"]),
        what="a taint",
    )
    tainted = {d["name"]: d.get("taints") for d in taints["spec"]["devices"] if d.get("taints")}
    assert list(tainted) == [device]
    assert [(t["key"], t["value"], t["effect"]) for t in tainted[device]] == [("cdiplug.dev/thermal", "85C", "NoSchedule")]
    back = timed_change(f"{device}: Healthy\n", "Healthy")
    prod.watch(
        "resourceslices",
        lambda s: s["spec"]["driver"] == DRIVER and not any(d.get("taints") for d in s["spec"]["devices"]),
        what="the taint gone after the recovery",
    )
    print(f"health change -> pod allocatedResourcesStatus: Unhealthy after {took:.2f} s, Healthy again after {back:.2f} s")
    assert took < 2.0 and back < 2.0, (took, back)


def test_after_a_wiped_cdi_folder_and_a_restart_a_restarted_container_gets_its_device(
    prod: Any, apply: Callable[..., None]
) -> None:
    apply(template(), pod("survivor", from_template="one-fpga", restart="Always"))
    ready(prod, "survivor")
    device = fpga_of(prod, "survivor")
    spec = CDI_DIR / f"cdiplug-claim-{claim_of(prod, 'survivor')['metadata']['uid']}.json"
    before = spec.read_bytes()
    # What a reboot does to /var/run (a tmpfs): every claim spec gone; then cdiplug starts again.
    for stale in CDI_DIR.glob("cdiplug-claim-*.json"):
        stale.unlink()
    old = prod.daemon_pod()["metadata"]["name"]
    prod("delete", "pod", "-n", NAMESPACE, old, "--wait=true", "--timeout=90s", timeout=100)
    prod.watch(
        "pods",
        lambda p: p["metadata"]["name"] != old and prod.is_ready(p),
        what="a new Ready cdiplug pod",
        namespace=NAMESPACE,
        selector="app.kubernetes.io/name=cdiplug",
        timeout=120,
    )
    wait_for_file(spec, present=True, timeout=30)
    assert spec.read_bytes() == before  # the same spec, from the checkpoint
    # The container stops and the kubelet starts it again: containerd needs the spec to do so.
    # (The exec itself ends with the container: its exit status says nothing.)
    prod("exec", "-n", TEST_NAMESPACE, "survivor", "--", "kill", "1", check=False)
    prod.watch(
        "pod/survivor",
        lambda p: prod.is_ready(p) and p["status"]["containerStatuses"][0]["restartCount"] >= 1,
        namespace=TEST_NAMESPACE,
        what="survivor restarted and Ready",
        timeout=120,
    )
    assert fpga_of(prod, "survivor") == device


def test_a_rolling_update_fails_no_prepare_and_keeps_the_running_pod(prod: Any, apply: Callable[..., None]) -> None:
    apply(template(), pod("holder", from_template="one-fpga"))
    held = ready(prod, "holder")["status"]["containerStatuses"][0]["containerID"]
    device = fpga_of(prod, "holder")
    old = prod.daemon_pod()["metadata"]["uid"]
    tag = "0.1.0-dra-rolling"
    subprocess.run([str(SCRIPT), "images", tag], check=True, capture_output=True, timeout=600)

    def update() -> None:
        prod("set", "image", "-n", NAMESPACE, "daemonset/cdiplug", f"cdiplug=cdiplug:{tag}")
        prod("rollout", "status", "-n", NAMESPACE, "daemonset/cdiplug", "--timeout=300s", timeout=310)

    started = time.monotonic()
    starts = stream_pods(prod, TEST_NAMESPACE, lambda name: pod(name, from_template="one-fpga"), update, at_least=MIN_DURING)
    took = time.monotonic() - started
    events = prod.get("events", TEST_NAMESPACE)["items"]
    warnings = [f"{e['involvedObject']['name']}: {e['reason']}: {e['message']}" for e in events if e["type"] == "Warning"]
    assert not [w for w in warnings if "Prepare" in w or "prepare" in w], warnings
    (daemon,) = [
        p
        for p in prod.get("pods", NAMESPACE)["items"]
        if p["metadata"].get("labels", {}).get("app.kubernetes.io/name") == "cdiplug"
    ]
    assert daemon["metadata"]["uid"] != old and daemon["spec"]["containers"][0]["image"] == f"cdiplug:{tag}"
    (status,) = prod.get("pod/holder", TEST_NAMESPACE)["status"]["containerStatuses"]
    assert status["containerID"] == held and status["restartCount"] == 0 and status["ready"]
    assert fpga_of(prod, "holder") == device
    longest = max(starts.items(), key=lambda kv: kv[1])
    print(
        f"rolling update (maxSurge 1) in {took:.1f} s: {len(starts)} claim pods made one a second, all Running, "
        f"no failed prepare; longest start {longest[1]:.1f} s ({longest[0]}), median "
        f"{sorted(starts.values())[len(starts) // 2]:.1f} s"
    )
