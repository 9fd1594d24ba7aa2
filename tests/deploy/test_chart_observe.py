"""The chart's observability and admission templates, rendered by real Helm: the PrometheusRule
carries the shipped rule file, the dashboard ConfigMap the shipped JSON (the chart's copies are
byte-equal to deploy/prometheus), the ServiceMonitor and PodMonitor select the daemon and add the
`node` label, and the admission webhook names exactly the release's drivers, with a CA that signed
its serving certificate."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from cdiplug.cli import build_parser
from cdiplug.config import parse_config
from cdiplug.models.resource import Api

from .chart import CHART, EXAMPLES, find, one, template

REPO = Path(__file__).resolve().parents[2]
PROM = REPO / "deploy" / "prometheus"
ALL_ON = {
    "admission": {"enabled": True},
    "prometheusRule": {"enabled": True},
    "dashboard": {"enabled": True},
    "metrics": {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}},
}
EXAMPLE_FILES = sorted(EXAMPLES.glob("*.yaml"))


@pytest.mark.parametrize("name", ["cdiplug-rules.yaml", "cdiplug-dashboard.json"])
def test_the_chart_carries_the_shipped_files_unchanged(name: str) -> None:
    assert (CHART / "files" / name).read_bytes() == (PROM / name).read_bytes(), (
        f"deploy/helm/cdiplug/files/{name} differs from deploy/prometheus/{name}: copy it over"
    )


def test_off_by_default() -> None:
    kinds = {o["kind"] for o in template()}
    assert not kinds & {"PrometheusRule", "ServiceMonitor", "PodMonitor", "ValidatingWebhookConfiguration", "Deployment"}


def test_prometheus_rule_and_dashboard(tmp_path: Path) -> None:
    base = "https://example.org/cdiplug/blob/main/"
    objects = template(
        {**ALL_ON, "prometheusRule": {"enabled": True, "runbookBaseURL": base, "labels": {"release": "kps"}}}, tmp=tmp_path
    )
    rule = one(objects, "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kps"
    shipped = yaml.safe_load((PROM / "cdiplug-rules.yaml").read_text())["groups"]
    text = json.dumps(shipped).replace('"docs/troubleshooting.md', f'"{base}docs/troubleshooting.md')
    assert rule["spec"]["groups"] == json.loads(text)
    board = one(objects, "ConfigMap", "cdiplug-dashboard")
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(board["data"]["cdiplug-dashboard.json"]) == json.loads((PROM / "cdiplug-dashboard.json").read_text())


def test_monitors_select_the_daemon_and_label_the_node(tmp_path: Path) -> None:
    objects = template(ALL_ON, tmp=tmp_path)
    daemon = one(objects, "DaemonSet")
    pod_labels = daemon["spec"]["template"]["metadata"]["labels"]
    metrics_service = one(objects, "Service", "cdiplug-metrics")
    relabel = [{"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"}]
    monitor = one(objects, "ServiceMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= metrics_service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics" and monitor["spec"]["endpoints"][0]["relabelings"] == relabel
    webhook_service = one(objects, "Service", "cdiplug-webhook")
    assert not monitor["spec"]["selector"]["matchLabels"].items() <= webhook_service["metadata"]["labels"].items()
    pods = one(objects, "PodMonitor")
    assert pods["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert pods["spec"]["podMetricsEndpoints"][0]["relabelings"] == relabel
    webhook_pods = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert not daemon["spec"]["selector"]["matchLabels"].items() <= webhook_pods.items()
    assert not pods["spec"]["selector"]["matchLabels"].items() <= webhook_pods.items()


def drivers_of(objects: list[dict[str, Any]]) -> set[str]:
    config = parse_config(yaml.safe_load(one(objects, "ConfigMap", "cdiplug-config")["data"]["config.yaml"]), "chart")
    names = config.names or (None,)
    out = set()
    for name in names:
        raw = yaml.safe_load(one(objects, "ConfigMap", "cdiplug-config")["data"]["config.yaml"])
        out |= {r.settings.dra_driver for r in parse_config(raw, "chart", configuration=name).resources if r.api == Api.DRA}
    return out


@pytest.mark.parametrize("example", EXAMPLE_FILES, ids=[p.stem for p in EXAMPLE_FILES])
def test_admission_names_exactly_the_release_drivers(example: Path, tmp_path: Path) -> None:
    objects = template(example, {"admission": {"enabled": True}}, tmp=tmp_path)
    drivers = drivers_of(objects)
    hooks = find(objects, "ValidatingWebhookConfiguration")
    if not drivers:
        assert not hooks  # no DRA driver: nothing to judge
        return
    (config,) = hooks
    assert {h["rules"][0]["resources"][0] for h in config["webhooks"]} == {
        "resourceclaims",
        "resourceclaimtemplates",
        "deviceclasses",
    }
    for hook in config["webhooks"]:
        expression = hook["matchConditions"][0]["expression"]
        listed = expression.split(" in [", 1)[1].split("]", 1)[0]
        assert {d.strip(" '") for d in listed.split(",")} == drivers
        assert hook["failurePolicy"] == "Ignore" and hook["sideEffects"] == "None"
        assert hook["clientConfig"]["service"] == {
            "name": "cdiplug-webhook",
            "namespace": "cdiplug-system",
            "path": "/validate",
            "port": 443,
        }
    secret = one(objects, "Secret", "cdiplug-webhook-tls")
    ca = x509.load_pem_x509_certificate(base64.b64decode(config["webhooks"][0]["clientConfig"]["caBundle"]))
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert "cdiplug-webhook.cdiplug-system.svc" in names
    deployment = one(objects, "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    build_parser("webhook").parse_args(container["args"])  # cdiplug accepts the command line
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["config"]["configMap"]["name"] == "cdiplug-config"
    role = next(o for o in find(objects, "ClusterRole") if o["metadata"]["name"].endswith("-webhook"))
    assert role["rules"] == [{"apiGroups": ["resource.k8s.io"], "resources": ["deviceclasses"], "verbs": ["get"]}]


def test_admission_failure_policy_is_a_choice(tmp_path: Path) -> None:
    example = EXAMPLES / "fake-dra.yaml"
    objects = template(example, {"admission": {"enabled": True, "failurePolicy": "Fail"}}, tmp=tmp_path)
    assert {h["failurePolicy"] for h in one(objects, "ValidatingWebhookConfiguration")["webhooks"]} == {"Fail"}
