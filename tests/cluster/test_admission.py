"""The admission webhook on a real node: ``deploy/admission`` (the ``cdiplug webhook`` Deployment,
its Service, RBAC and ValidatingWebhookConfiguration) beside the DRA deployment of
``tests/cluster/overlays/dra``, with a TLS certificate made here for the Service's DNS name.

The API server reaches the webhook through its Service: hack/local-cluster.sh runs no kube-proxy,
and its API server routes to a Service's endpoints itself (``--enable-aggregator-routing``); the
pod's address on the node's bridge is reachable from the host.

- bad configurations (unknown field, wrong type, bad value, unknown kind, wrong apiVersion, kind
  missing, bad variable name, too many variables, a value too long, in a template, in a
  DeviceClass) are refused at create with the prepare's message; the same for another driver is
  admitted;
- a claim with a good configuration runs its pod;
- the webhook down: another driver's claims are admitted, ours too (failurePolicy Ignore), and a bad
  one fails at prepare with the same message;
- 200 claims created while the webhook restarts: every one is there.
"""

from __future__ import annotations

import base64
import datetime
import json
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
ADMISSION = REPO / "deploy" / "admission"
DRA_TEST_OVERLAY = Path(__file__).resolve().parent / "overlays" / "dra"
DRA_OVERLAY = REPO / "deploy" / "overlays" / "dra"
FAKE_OVERLAY = REPO / "deploy" / "overlays" / "fake"
NAMESPACE = "cdiplug-system"
TEST_NAMESPACE = "cdiplug-admission-test"
DRIVER = "fpga.example.com"
OTHER = "gpu.other-vendor.example.com"
API = "cdiplug.dev/v1alpha1"
SERVICE_DNS = f"cdiplug-webhook.{NAMESPACE}.svc"


def certificates() -> tuple[str, str, str]:
    """(CA PEM, server certificate PEM, server key PEM) for the webhook's Service name."""
    now = datetime.datetime.now(datetime.UTC)

    def make(name: str, issuer: tuple[Any, x509.Name] | None, ca: bool) -> tuple[Any, x509.Certificate]:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        signer, issuer_name = issuer or (key, subject)
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(issuer_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=4))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if not ca:
            builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(SERVICE_DNS)]), critical=False)
        return key, builder.sign(signer, hashes.SHA256())

    ca_key, ca_cert = make("cdiplug webhook test CA", None, True)
    key, cert = make(SERVICE_DNS, (ca_key, ca_cert.subject), False)
    pem = serialization.Encoding.PEM
    return (
        ca_cert.public_bytes(pem).decode(),
        cert.public_bytes(pem).decode(),
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode(),
    )


def admission_objects(ca: str) -> list[dict[str, Any]]:
    """deploy/admission as kustomize renders it, with this cluster's settings: the test DRA
    configuration, one replica, the CA in the webhook configuration."""
    rendered = subprocess.run(["kubectl", "kustomize", str(ADMISSION)], capture_output=True, text=True, check=True).stdout
    objects = [o for o in yaml.safe_load_all(rendered) if o]
    config = (DRA_TEST_OVERLAY / "config.yaml").read_text()
    for obj in objects:
        if obj["kind"] == "ConfigMap":
            obj["data"]["config.yaml"] = config
        elif obj["kind"] == "Deployment":
            obj["spec"]["replicas"] = 1
        elif obj["kind"] == "ValidatingWebhookConfiguration":
            for hook in obj["webhooks"]:
                hook["clientConfig"]["caBundle"] = base64.b64encode(ca.encode()).decode()
    return objects


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
    had_fake = bool(kube("get", "daemonset/cdiplug", "-n", NAMESPACE, "--ignore-not-found", "-o", "name").strip())
    kube("delete", "namespace", TEST_NAMESPACE, "--ignore-not-found", "--wait=true", "--timeout=120s", timeout=150)
    kube("apply", "--validate=false", "-k", str(DRA_TEST_OVERLAY))
    kube("rollout", "restart", "-n", NAMESPACE, "daemonset/cdiplug")
    kube("rollout", "status", "-n", NAMESPACE, "daemonset/cdiplug", "--timeout=180s", timeout=190)
    ca, cert, key = certificates()
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": {"name": "cdiplug-webhook-tls", "namespace": NAMESPACE},
        "stringData": {"tls.crt": cert, "tls.key": key},
    }
    kube.apply([secret, *admission_objects(ca)])
    kube("rollout", "restart", "-n", NAMESPACE, "deployment/cdiplug-webhook")
    kube("rollout", "status", "-n", NAMESPACE, "deployment/cdiplug-webhook", "--timeout=180s", timeout=190)
    kube("create", "namespace", TEST_NAMESPACE)
    kube("wait", "--for=create", "serviceaccount/default", "-n", TEST_NAMESPACE, "--timeout=60s", timeout=70)
    wait_webhook(kube, up=True)
    yield kube
    kube(
        "delete",
        "--ignore-not-found",
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": admission_objects(ca)}),
        timeout=120,
    )
    kube("delete", "secret", "cdiplug-webhook-tls", "-n", NAMESPACE, "--ignore-not-found")
    kube("delete", "deviceclasses", "-l", "cdiplug.test/admission=true", "--ignore-not-found")
    kube("delete", "namespace", TEST_NAMESPACE, "--ignore-not-found", "--wait=true", "--timeout=120s", timeout=150)
    kube("delete", "-f", str(DRA_OVERLAY / "deviceclass.yaml"), "--ignore-not-found", timeout=60)
    if had_fake:
        kube("apply", "--validate=false", "-k", str(FAKE_OVERLAY))
        kube("rollout", "status", "-n", NAMESPACE, "daemonset/cdiplug", "--timeout=180s", timeout=190)
    else:
        kube("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true", "--timeout=120s", timeout=150)
    kube("delete", "-f", str(DRA_OVERLAY / "rbac.yaml"), "--ignore-not-found", timeout=60)


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
    webhook("scale", "-n", NAMESPACE, "deployment/cdiplug-webhook", "--replicas=0")
    webhook(
        "wait",
        "-n",
        NAMESPACE,
        "--for=delete",
        "pod",
        "-l",
        "app.kubernetes.io/name=cdiplug-webhook",
        "--timeout=90s",
        timeout=100,
    )
    try:
        wait_webhook(webhook, up=False)
        assert create(webhook, claim("other-while-down", fake(shairng=True), OTHER))[0] == 0
        assert create(webhook, claim("ours-while-down", fake(shairng=True)))[0] == 0
        webhook.apply([pod("bad", "ours-while-down")])
        message = f'unknown field "shairng" @ $.parameters (claim {TEST_NAMESPACE}/ours-while-down, request fpga)'

        def prepare_refused(event: dict[str, Any]) -> bool:
            return event.get("involvedObject", {}).get("name") == "bad" and message in event.get("message", "")

        webhook.watch(
            "events", prepare_refused, what="the prepare's refusal in the pod's events", namespace=TEST_NAMESPACE, timeout=120
        )
    finally:
        webhook.delete_pods(TEST_NAMESPACE, "bad")
        webhook("delete", "resourceclaim", "ours-while-down", "other-while-down", "-n", TEST_NAMESPACE, "--ignore-not-found")
        webhook("scale", "-n", NAMESPACE, "deployment/cdiplug-webhook", "--replicas=1")
        webhook("rollout", "status", "-n", NAMESPACE, "deployment/cdiplug-webhook", "--timeout=180s", timeout=190)
    wait_webhook(webhook, up=True)


def test_claims_made_while_the_webhook_restarts_are_all_there(webhook: Any) -> None:
    webhook("rollout", "restart", "-n", NAMESPACE, "deployment/cdiplug-webhook")
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
    webhook("rollout", "status", "-n", NAMESPACE, "deployment/cdiplug-webhook", "--timeout=180s", timeout=190)
    listed = webhook.get("resourceclaims", TEST_NAMESPACE)["items"]
    assert {c["metadata"]["name"] for c in listed} >= set(names), out[-2000:]
    print(f"200 claims created in {took:.1f}s while the webhook restarted")
    webhook("delete", "resourceclaims", "--all", "-n", TEST_NAMESPACE, "--wait=true", timeout=180)
