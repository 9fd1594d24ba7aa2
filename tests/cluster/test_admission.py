"""The admission webhook on a real node, installed by the Helm chart (``admission.enabled``: the
``cdiplug webhook`` Deployment, its Service, RBAC, the certificate the chart makes and the
ValidatingWebhookConfiguration naming the release's drivers) with a DRA release of the fake
backend (driver fpga.example.com).

The API server reaches the webhook through its Service: hack/local-cluster.sh runs no kube-proxy,
and its API server routes to a Service's endpoints itself (``--enable-aggregator-routing``); the
pods' addresses on the node's bridge are reachable from the host.

- bad configurations (unknown field, wrong type, bad value, unknown kind, wrong apiVersion, kind
  missing, bad variable name, too many variables, a value too long, in a template, in a
  DeviceClass) are refused at create with the prepare's message; the same for another driver is
  admitted;
- a claim with a good configuration runs its pod;
- the webhook down: another driver's claims are admitted, ours too (failurePolicy Ignore), and a bad
  one fails at prepare with the same message;
- 200 claims created while the webhook restarts: every one is there.

The session's kustomize deployment (``cdiplug`` fixture) is taken away first (it serves
example.com/fpga too) and put back at the end. deploy/admission (the same objects for kustomize)
is checked rendered in tests/deploy/test_admission_manifests.py.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ..deploy.chart import CHART, helm

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

NAMESPACE = "cdiplug-system"  # the session's kustomize deployment
FAKE_OVERLAY = Path(__file__).resolve().parents[2] / "deploy" / "overlays" / "fake"
RELEASE, RELEASE_NS = "adm", "cdiplug-admission"
WEBHOOK = f"{RELEASE}-cdiplug-webhook"  # the chart's names for release adm
TEST_NAMESPACE = "cdiplug-admission-test"
DRIVER = "fpga.example.com"
OTHER = "gpu.other-vendor.example.com"
API = "cdiplug.dev/v1alpha1"
VALUES = [
    "--set-json",
    'config={"resources": [{"name": "example.com/fpga", "backend": "fake", "api": "dra", "options": {"count": 2}}]}',
    "--set",
    "admission.enabled=true",
]


def fake(**body: Any) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "FakeConfig", **body}


def claim(name: str, params: Any, driver: str = DRIVER) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": TEST_NAMESPACE},
        "spec": {
            "devices": {
                "requests": [{"name": "fpga", "exactly": {"deviceClassName": DRIVER}}],
                "config": [{"opaque": {"driver": driver, "parameters": params}}],
            }
        },
    }


def template(name: str, params: Any, driver: str = DRIVER) -> dict[str, Any]:
    spec = claim(name, params, driver)["spec"]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": TEST_NAMESPACE},
        "spec": {"spec": spec},
    }


def device_class(name: str, params: Any, driver: str = DRIVER) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name, "labels": {"cdiplug.test/admission": "true"}},
        "spec": {
            "selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}],
            "config": [{"opaque": {"driver": driver, "parameters": params}}],
        },
    }


# (test id, object maker, parameters, what the refusal says)
BAD: list[tuple[str, Callable[..., dict[str, Any]], Any, str]] = [
    ("unknown-field", claim, fake(shairng=True), 'unknown field "shairng" @ $.parameters (claim {ns}/{name}, request fpga)'),
    ("wrong-type", claim, fake(env=["A=1"]), "@ $.parameters.env (claim {ns}/{name}, request fpga)"),
    ("bad-value", claim, fake(mode="sometimes"), "@ $.parameters.mode (claim {ns}/{name}, request fpga)"),
    ("unknown-kind", claim, {"apiVersion": API, "kind": "GpuConfig"}, "expected FakeConfig, got 'GpuConfig' @ $.parameters.kind"),
    ("wrong-api-version", claim, {"apiVersion": "cdiplug.dev/v1", "kind": "FakeConfig"}, "@ $.parameters.apiVersion"),
    ("kind-missing", claim, {"apiVersion": API}, "kind is required (FakeConfig) @ $.parameters.kind"),
    ("bad-env-name", claim, fake(env={"1A": "x"}), "not an environment variable name: '1A' @ $.parameters.env"),
    (
        "too-many-variables",
        claim,
        fake(env={f"V{i}": "x" for i in range(65)}),
        "has 65 variables, more than 64 @ $.parameters.env",
    ),
    ("value-too-long", claim, fake(env={"LONG": "x" * 5000}), "is 5000 characters long, more than 4096 @ $.parameters.env.LONG"),
    (
        "in-a-template",
        template,
        fake(shairng=1),
        'unknown field "shairng" @ $.parameters (ResourceClaimTemplate {ns}/{name}, request fpga)',
    ),
    (
        "in-a-device-class",
        device_class,
        fake(env={"A": 1}),
        "expected a string, got int 1 @ $.parameters.env['A'] (DeviceClass {name})",
    ),
]


def create(kube: Any, obj: dict[str, Any]) -> tuple[int, str]:
    result = subprocess.run(
        ["kubectl", "create", "--validate=false", "-f", "-"],
        input=json.dumps(obj),
        capture_output=True,
        text=True,
        env=kube.env,
        timeout=60,
    )
    return result.returncode, result.stdout + result.stderr


def refused_by_webhook(kube: Any, name: str) -> bool:
    code, out = create(kube, claim(name, fake(shairng=True)))
    if code == 0:
        kube("delete", "resourceclaim", name, "-n", TEST_NAMESPACE, "--ignore-not-found")
    return code != 0 and "shairng" in out


def until_created(kube: Any, make: Callable[[int], dict[str, Any]], created: bool, timeout: float = 60) -> str:
    """Create ``make(n)`` (n = 0, 1, ...) until it is created (or refused): the API server applies a
    changed webhook configuration a moment later. What kubectl said the last time; what was
    created on the way to a refusal is deleted."""
    deadline = time.monotonic() + timeout
    n = 0
    while True:
        obj = make(n)
        code, out = create(kube, obj)
        if (code == 0) == created:
            return out
        if code == 0:
            kube("delete", "resourceclaim", obj["metadata"]["name"], "-n", TEST_NAMESPACE)
        assert time.monotonic() < deadline, f"not {'created' if created else 'refused'} within {timeout:g}s: {out}"
        n += 1
        time.sleep(0.5)


def wait_webhook(kube: Any, up: bool, timeout: float = 120) -> None:
    """Until a bad claim is refused (up) or admitted (down): the API server's view of the webhook."""
    deadline = time.monotonic() + timeout
    n = 0
    while refused_by_webhook(kube, f"probe-{n}") != up:
        n += 1
        assert time.monotonic() < deadline, f"the webhook did not turn {'on' if up else 'off'} in {timeout:g}s"
        time.sleep(1)


@pytest.fixture(scope="module")
def webhook(kube: Any) -> Iterator[Any]:
    had = bool(kube("get", "daemonset/cdiplug", "-n", NAMESPACE, "--ignore-not-found", "-o", "name").strip())
    if had:
        kube(
            "delete", "daemonset", "cdiplug", "-n", NAMESPACE, "--cascade=foreground", "--wait=true", "--timeout=90s", timeout=120
        )
    env = {"KUBECONFIG": str(kube.kubeconfig)}
    helm("uninstall", RELEASE, "-n", RELEASE_NS, "--ignore-not-found", "--wait", env=env, timeout=200)
    kube("delete", "namespace", TEST_NAMESPACE, "--ignore-not-found", "--wait=true", "--timeout=120s", timeout=150)
    kube("delete", "namespace", RELEASE_NS, "--ignore-not-found", "--wait=true", "--timeout=120s", timeout=150)
    kube("create", "namespace", RELEASE_NS)  # not helm's --create-namespace, which validates against OpenAPI
    result = helm(
        "install",
        RELEASE,
        str(CHART),
        "-n",
        RELEASE_NS,
        *VALUES,
        # As kubectl's --validate=false elsewhere: this API server build cannot serve its OpenAPI document.
        "--disable-openapi-validation",
        "--wait",
        "--timeout=300s",
        env=env,
        timeout=400,
    )
    assert result.returncode == 0, f"helm install: {result.stderr}"
    kube("rollout", "status", "-n", RELEASE_NS, f"deployment/{WEBHOOK}", "--timeout=180s", timeout=190)
    kube.watch(
        "resourceslices",
        lambda s: s["spec"]["driver"] == DRIVER and len(s["spec"].get("devices") or []) == 2,
        what="the fpga.example.com slice with two devices",
        timeout=120,
    )
    kube("create", "namespace", TEST_NAMESPACE)
    kube("wait", "--for=create", "serviceaccount/default", "-n", TEST_NAMESPACE, "--timeout=60s", timeout=70)
    wait_webhook(kube, up=True)
    yield kube
    kube("delete", "deviceclasses", "-l", "cdiplug.test/admission=true", "--ignore-not-found")
    kube("delete", "namespace", TEST_NAMESPACE, "--ignore-not-found", "--wait=true", "--timeout=120s", timeout=150)
    helm("uninstall", RELEASE, "-n", RELEASE_NS, "--ignore-not-found", "--wait", env=env, timeout=200)
    kube("delete", "namespace", RELEASE_NS, "--ignore-not-found", "--wait=true", "--timeout=120s", timeout=150)
    if had:
        kube("apply", "--validate=false", "-k", str(FAKE_OVERLAY))
        kube("rollout", "status", "-n", NAMESPACE, "daemonset/cdiplug", "--timeout=180s", timeout=190)


@pytest.mark.parametrize(("what", "make", "params", "message"), BAD, ids=[b[0] for b in BAD])
def test_bad_configuration_is_refused_at_create(webhook: Any, what: str, make: Any, params: Any, message: str) -> None:
    name = f"bad-{what}"
    code, out = create(webhook, make(name, params))
    assert code != 0, f"{what}: admitted"
    assert "denied the request" in out and message.format(ns=TEST_NAMESPACE, name=name) in out, out
    other = make(f"other-{what}", params, OTHER)  # the same for another vendor's driver: never looked at
    code, out = create(webhook, other)
    assert code == 0, out
    if other["kind"] == "DeviceClass":
        webhook("delete", "deviceclass", other["metadata"]["name"])
    else:
        webhook("delete", other["kind"].lower(), other["metadata"]["name"], "-n", TEST_NAMESPACE)


def pod(name: str, claim_name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": TEST_NAMESPACE},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "resourceClaims": [{"name": "fpga", "resourceClaimName": claim_name}],
            "containers": [
                {"name": "c", "image": "busybox:1.36", "command": ["sleep", "3600"], "resources": {"claims": [{"name": "fpga"}]}}
            ],
        },
    }


def test_good_claim_runs(webhook: Any) -> None:
    good = claim("good", fake(mode="shared", env={"GREETING": "hello"}))
    assert create(webhook, good)[0] == 0
    webhook.apply([pod("good", "good")])
    try:
        webhook.wait_pod_ready("good", TEST_NAMESPACE, timeout=120)
        assert webhook.env_of("good", TEST_NAMESPACE)["GREETING"] == "hello"
    finally:
        webhook.delete_pods(TEST_NAMESPACE, "good")
        webhook("delete", "resourceclaim", "good", "-n", TEST_NAMESPACE, "--wait=true", timeout=90)


def test_webhook_down_admits_and_prepare_refuses(webhook: Any) -> None:
    webhook("scale", "-n", RELEASE_NS, f"deployment/{WEBHOOK}", "--replicas=0")
    webhook(
        "wait",
        "-n",
        RELEASE_NS,
        "--for=delete",
        "pod",
        "-l",
        "app.kubernetes.io/name=cdiplug-webhook",
        "--timeout=90s",
        timeout=100,
    )
    config = f"{RELEASE_NS}-{WEBHOOK}"  # the chart's ValidatingWebhookConfiguration

    def failure_policy(policy: str) -> None:
        patch = [{"op": "replace", "path": f"/webhooks/{i}/failurePolicy", "value": policy} for i in range(3)]
        webhook("patch", "validatingwebhookconfiguration", config, "--type=json", "-p", json.dumps(patch))

    try:
        wait_webhook(webhook, up=False)
        # Even with failurePolicy Fail, a down webhook holds up no other driver's claim: the API
        # server's matchConditions never send it there. Ours are refused then (the webhook unreachable).
        failure_policy("Fail")
        try:
            out = until_created(webhook, lambda n: claim(f"ours-fail-{n}", fake(mode="shared")), created=False)
            assert "failed calling webhook" in out, out
            assert create(webhook, claim("other-fail", fake(shairng=True), OTHER))[0] == 0
        finally:
            failure_policy("Ignore")
        until_created(webhook, lambda n: claim("ours-while-down", fake(shairng=True)), created=True)
        assert create(webhook, claim("other-while-down", fake(shairng=True), OTHER))[0] == 0
        webhook.apply([pod("bad", "ours-while-down")])
        message = f'unknown field "shairng" @ $.parameters (claim {TEST_NAMESPACE}/ours-while-down, request fpga)'

        def prepare_refused(event: dict[str, Any]) -> bool:
            return event.get("involvedObject", {}).get("name") == "bad" and message in event.get("message", "")

        webhook.watch(
            "events", prepare_refused, what="the prepare's refusal in the pod's events", namespace=TEST_NAMESPACE, timeout=120
        )
    finally:
        webhook.delete_pods(TEST_NAMESPACE, "bad")
        webhook(
            "delete",
            "resourceclaim",
            "ours-while-down",
            "other-while-down",
            "other-fail",
            "-n",
            TEST_NAMESPACE,
            "--ignore-not-found",
        )
        webhook("scale", "-n", RELEASE_NS, f"deployment/{WEBHOOK}", "--replicas=2")
        webhook("rollout", "status", "-n", RELEASE_NS, f"deployment/{WEBHOOK}", "--timeout=180s", timeout=190)
    wait_webhook(webhook, up=True)


def test_claims_made_while_the_webhook_restarts_are_all_there(webhook: Any) -> None:
    webhook("rollout", "restart", "-n", RELEASE_NS, f"deployment/{WEBHOOK}")
    started = time.monotonic()
    names = [f"burst-{i}" for i in range(200)]
    items = [claim(n, fake(env={"N": n})) for n in names]
    out = webhook(
        "create",
        "--validate=false",
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}),
        timeout=300,
    )
    took = time.monotonic() - started
    webhook("rollout", "status", "-n", RELEASE_NS, f"deployment/{WEBHOOK}", "--timeout=180s", timeout=190)
    listed = webhook.get("resourceclaims", TEST_NAMESPACE)["items"]
    assert {c["metadata"]["name"] for c in listed} >= set(names), out[-2000:]
    print(f"200 claims created in {took:.1f}s while the webhook restarted")
    webhook("delete", "resourceclaims", "--all", "-n", TEST_NAMESPACE, "--wait=true", timeout=180)
