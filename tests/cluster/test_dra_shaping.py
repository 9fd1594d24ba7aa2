"""DRA claims that shape their device, on a real node: per-claim configuration and admin access.

cdiplug from ``tests/cluster/overlays/dra`` (the DRA overlay on the node's network) with the
configuration of ``deploy/examples/dra/cdiplug-config.yaml`` (its ConfigMap applied and the
DaemonSet pointed at it, as that file says), with the real kubelet, scheduler, resourceclaim
controller and containerd (CDI) of ``hack/local-cluster.sh``. Covers:
``configured.yaml``'s pod reads the merged configuration (class, then claim) in its own env; a
claim whose configuration has an unknown field fails only its pod (the kubelet's event names the
field, the claim and the request) while a configured pod beside it runs; ``admin-access.yaml``'s
monitor runs beside the workload on the same device, marked in its env, not prepared for it (no
marker file of the fake's ``prepared_dir``), and neither holds the workload's release back nor
releases anything itself. The fake overlay is put back at the end, as tests/cluster/test_dra.py does.

Run by the lead (never by helpers): ``.venv/bin/python -m pytest -m cluster tests/cluster/test_dra_shaping.py -x``.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from .conftest import wait_for_file

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
TEST_OVERLAY = Path(__file__).resolve().parent / "overlays" / "dra"
DRA_OVERLAY = REPO / "deploy" / "overlays" / "dra"
FAKE_OVERLAY = REPO / "deploy" / "overlays" / "fake"
EXAMPLES = REPO / "deploy" / "examples" / "dra"
NAMESPACE = "cdiplug-system"
TEST_NAMESPACE = "cdiplug-shaping-test"
ADMIN_NAMESPACE = "cdiplug-admin"  # admin-access.yaml's own, labelled for admin access
LABEL = "cdiplug.test/shaping"
DRIVER = "fpga.example.com"
CDI_DIR = Path("/var/run/cdi")
PREPARED = Path("/var/lib/cdiplug/prepared")  # cdiplug-config.yaml's prepared_dir, on the node
CONFIG_VOLUME = {
    "spec": {"template": {"spec": {"volumes": [{"name": "config", "configMap": {"name": "cdiplug-examples-config"}}]}}}
}


def example(name: str, namespace: str | None = TEST_NAMESPACE) -> list[dict[str, Any]]:
    """The objects of ``deploy/examples/dra/<name>``, labelled; namespaced ones moved to ``namespace``
    (None: kept where the file puts them); pods stop at once when deleted."""
    objects = [o for o in yaml.safe_load_all((EXAMPLES / name).read_text()) if o]
    for obj in objects:
        obj["metadata"].setdefault("labels", {})[LABEL] = "true"
        if obj["kind"] in ("ResourceClaimTemplate", "Pod") and namespace is not None:
            obj["metadata"]["namespace"] = namespace
        if obj["kind"] == "Pod":
            obj["spec"]["terminationGracePeriodSeconds"] = 1
            for c in obj["spec"]["containers"]:
                c["command"] = ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"]
    return objects


def one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"{kind} {name}: {len(found)}"
    return copy.deepcopy(found[0])


def ready(kube: Any, name: str, namespace: str = TEST_NAMESPACE, timeout: float = 120) -> dict[str, Any]:
    pod: dict[str, Any] = kube.wait_pod_ready(name, namespace, timeout=timeout)
    return pod


@pytest.fixture(scope="module")
def shaping(kube: Any) -> Iterator[Any]:
    """cdiplug as DRA driver with the examples' configuration; the fake overlay back after."""
    had_fake = bool(kube("get", "daemonset/cdiplug", "-n", NAMESPACE, "--ignore-not-found", "-o", "name").strip())
    for ns in (TEST_NAMESPACE, ADMIN_NAMESPACE):
        kube("delete", "namespace", ns, "--ignore-not-found", "--wait=true", "--timeout=120s", timeout=150)
    kube("apply", "--validate=false", "-k", str(TEST_OVERLAY))
    kube("apply", "--validate=false", "-f", str(EXAMPLES / "cdiplug-config.yaml"))
    kube("patch", "daemonset/cdiplug", "-n", NAMESPACE, "-p", json.dumps(CONFIG_VOLUME))
    kube("rollout", "restart", "-n", NAMESPACE, "daemonset/cdiplug")
    kube("rollout", "status", "-n", NAMESPACE, "daemonset/cdiplug", "--timeout=180s", timeout=190)
    kube.daemon_pod()
    kube.watch(
        "resourceslices",
        lambda s: s["spec"]["driver"] == DRIVER and len(s["spec"].get("devices") or []) == 2,
        what="the fpga.example.com slice with two devices",
    )
    kube("create", "namespace", TEST_NAMESPACE)
    kube("wait", "--for=create", "serviceaccount/default", "-n", TEST_NAMESPACE, "--timeout=60s", timeout=70)
    yield kube
    for ns in (TEST_NAMESPACE, ADMIN_NAMESPACE):
        kube("delete", "namespace", ns, "--ignore-not-found", "--wait=true", "--timeout=120s", timeout=150)
    kube("delete", "deviceclass", "-l", LABEL, "--ignore-not-found", timeout=60)
    kube("delete", "configmap", "cdiplug-examples-config", "-n", NAMESPACE, "--ignore-not-found", timeout=60)
    kube("delete", "-f", str(DRA_OVERLAY / "deviceclass.yaml"), "--ignore-not-found", timeout=60)
    if had_fake:
        kube("apply", "--validate=false", "-k", str(FAKE_OVERLAY))
        kube("rollout", "status", "-n", NAMESPACE, "daemonset/cdiplug", "--timeout=180s", timeout=190)
        kube.daemon_pod()
    else:
        kube("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true", "--timeout=120s", timeout=150)
    kube("delete", "-f", str(DRA_OVERLAY / "rbac.yaml"), "--ignore-not-found", timeout=60)


@pytest.fixture
def apply(shaping: Any) -> Iterator[Callable[..., None]]:
    """``apply(objects)``; every labelled pod and template is deleted after the test, waiting until
    the kubelet has unprepared their claims."""

    def make(*objects: dict[str, Any]) -> None:
        shaping.apply(list(objects))

    yield make
    for ns in (TEST_NAMESPACE, ADMIN_NAMESPACE):
        if not shaping("get", "namespace", ns, "--ignore-not-found", "-o", "name").strip():
            continue
        shaping.delete_pods(ns, selector=LABEL)
        shaping("delete", "resourceclaimtemplates", "-n", ns, "-l", LABEL, "--ignore-not-found", "--wait=true", timeout=120)
        shaping("wait", "--for=delete", "resourceclaims", "--all", "-n", ns, "--timeout=90s", timeout=100)


def test_a_configured_claim_shows_its_configuration_inside_the_container(shaping: Any, apply: Callable[..., None]) -> None:
    objects = example("configured.yaml")
    apply(one(objects, "DeviceClass"), one(objects, "ResourceClaimTemplate"), one(objects, "Pod"))
    ready(shaping, "dra-configured-pod")
    env = shaping.env_of("dra-configured-pod", TEST_NAMESPACE)
    device = env["FAKE_FPGA_DEVICES"]
    index = device.rpartition("-")[2]
    # The class's entry, then the claim's: LOG_LEVEL from the claim, TEAM and the mode from the class.
    assert (env[f"FAKE_FPGA_DEVICE_{index}_MODE"], env["LOG_LEVEL"], env["TEAM"]) == ("shared", "debug", "red"), env


def test_a_broken_configuration_fails_only_its_pod(shaping: Any, apply: Callable[..., None]) -> None:
    objects = example("configured.yaml")
    broken = one(objects, "ResourceClaimTemplate")
    broken["metadata"]["name"] = "broken-fpga"
    broken["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"]["shairng"] = True
    broken_pod = one(objects, "Pod")
    broken_pod["metadata"]["name"] = "dra-broken-pod"
    broken_pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] = "broken-fpga"
    apply(one(objects, "DeviceClass"), one(objects, "ResourceClaimTemplate"), broken, one(objects, "Pod"), broken_pod)
    ready(shaping, "dra-configured-pod")  # beside it, a good claim prepares and runs
    event = shaping.watch(
        "events",
        lambda e: e["involvedObject"].get("name") == "dra-broken-pod" and "shairng" in e.get("message", ""),
        what="the broken pod's event naming the field",
        namespace=TEST_NAMESPACE,
        timeout=120,
    )
    claim = shaping.get("pod/dra-broken-pod", TEST_NAMESPACE)["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    assert f'unknown field "shairng" @ $.parameters (claim {TEST_NAMESPACE}/{claim}, request fpga)' in event["message"], event
    status = shaping.get("pod/dra-broken-pod", TEST_NAMESPACE)["status"]
    assert status["phase"] == "Pending" and not any(c.get("ready") for c in status.get("containerStatuses") or [])
    assert shaping.get("pod/dra-configured-pod", TEST_NAMESPACE)["status"]["phase"] == "Running"


def test_an_admin_access_pod_beside_a_normal_user(shaping: Any, apply: Callable[..., None]) -> None:
    objects = example("admin-access.yaml", namespace=None)
    shaping.apply([one(objects, "Namespace")])
    shaping("wait", "--for=create", "serviceaccount/default", "-n", ADMIN_NAMESPACE, "--timeout=60s", timeout=70)
    marker = PREPARED / "fpga-0"
    apply(*(o for o in objects if o["kind"] != "Namespace"))
    ready(shaping, "dra-fpga-workload", ADMIN_NAMESPACE)
    ready(shaping, "dra-fpga-monitor", ADMIN_NAMESPACE)
    workload = shaping.env_of("dra-fpga-workload", ADMIN_NAMESPACE)
    monitor = shaping.env_of("dra-fpga-monitor", ADMIN_NAMESPACE)
    assert workload["FAKE_FPGA_DEVICES"] == monitor["FAKE_FPGA_DEVICES"] == "fpga-0"
    assert monitor["CDIPLUG_ADMIN_ACCESS"] == "true" and "CDIPLUG_ADMIN_ACCESS" not in workload
    assert marker.exists()  # prepared once, for the workload
    name = shaping.get("pod/dra-fpga-monitor", ADMIN_NAMESPACE)["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    uid = shaping.get(f"resourceclaim/{name}", ADMIN_NAMESPACE)["metadata"]["uid"]
    shaping.delete_pods(ADMIN_NAMESPACE, "dra-fpga-monitor")
    wait_for_file(CDI_DIR / f"cdiplug-claim-{uid}.json", present=False)  # the monitor's claim unprepared
    assert marker.exists()  # and it released nothing
    apply(one(objects, "Pod", "dra-fpga-monitor"))  # back beside the workload
    ready(shaping, "dra-fpga-monitor", ADMIN_NAMESPACE)
    shaping.delete_pods(ADMIN_NAMESPACE, "dra-fpga-workload")
    wait_for_file(marker, present=False)  # the workload's release is not held back by the monitor
