"""The shipped Prometheus rules, their unit tests, the dashboard and docs/metrics.md, checked with
the real promtool (Debian's ``prometheus`` package, which hack/test.sh installs)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest

from cdiplug.telemetry.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
PROM = ROOT / "deploy" / "prometheus"
RULES = PROM / "cdiplug-rules.yaml"
RULE_TESTS = PROM / "cdiplug-rules.test.yaml"
DASHBOARD = PROM / "cdiplug-dashboard.json"
TROUBLESHOOTING = ROOT / "docs" / "troubleshooting.md"
METRICS_DOC = ROOT / "docs" / "metrics.md"

# What an operator needs to act on each alert.
REQUIRED_ALERTS = {
    "CdiplugDaemonNotScraped",
    "CdiplugResourceNotRegistered",
    "CdiplugDevicesUnhealthy",
    "CdiplugBackendRestartLoop",
    "CdiplugAllocateErrors",
    "CdiplugClaimOperationErrors",
    "CdiplugPrepareLatencyHigh",
    "CdiplugStateFileSetAside",
    "CdiplugSlicePublishFailing",
    "CdiplugCdiSpecWriteFailing",
}


def promtool() -> str:
    tool = shutil.which("promtool")
    assert tool, "promtool is missing: apt-get install prometheus (hack/test.sh installs it)"
    return tool


def alerts() -> dict[str, dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {r["alert"]: r for g in groups for r in g["rules"] if "alert" in r}


def anchors(markdown: str) -> set[str]:
    """GitHub's anchors of the headings of ``markdown``."""
    out = set()
    for line in markdown.splitlines():
        m = re.match(r"#+\s+(.*)", line)
        if m:
            out.add(re.sub(r"[^a-z0-9 _-]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return out


def test_promtool_checks_the_rules() -> None:
    done = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_promtool_unit_tests_pass() -> None:
    done = subprocess.run([promtool(), "test", "rules", RULE_TESTS.name], cwd=PROM, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_broken_rule_fails_its_unit_test(tmp_path: Path) -> None:
    """The unit tests can fail: the health alert's bound moved, its test no longer passes."""
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
    (tmp_path / RULES.name).write_text(
        RULES.read_text().replace("cdiplug_unhealthy_devices > 0", "cdiplug_unhealthy_devices > 5")
    )
    done = subprocess.run(
        [promtool(), "test", "rules", RULE_TESTS.name], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0
    assert "CdiplugDevicesUnhealthy" in done.stdout + done.stderr


def test_every_alert_is_documented_and_tested_both_ways() -> None:
    found = alerts()
    assert REQUIRED_ALERTS <= found.keys()
    docs = anchors(TROUBLESHOOTING.read_text())
    cases: dict[str, list[bool]] = {}
    for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for case in test.get("alert_rule_test", []):
            cases.setdefault(case["alertname"], []).append(bool(case["exp_alerts"]))
    for name, rule in found.items():
        notes = rule["annotations"]
        assert notes.get("summary"), name
        assert "{{ $labels.node }}" in notes["description"], f"{name}: the description names no node"
        assert re.search(r"\{\{ \$labels\.(resource|driver|backend|kind|file|instance) \}\}", notes["description"]), name
        url = notes["runbook_url"]
        assert url.startswith("docs/troubleshooting.md#"), url
        assert url.split("#", 1)[1] in docs, f"{name}: {url} has no heading in docs/troubleshooting.md"
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        assert True in cases.get(name, []), f"{name}: no unit test where it fires"
        assert False in cases.get(name, []), f"{name}: no unit test where it stays silent"


def daemon_metrics() -> dict[str, set[str]]:
    """Every metric a daemon's registry exposes (name as scraped -> its labels), each recorder
    method called once so that every labelled family has a series."""
    m = Metrics()
    m.configure(["example.com/fpga"])
    m.registered("example.com/fpga", again=False)
    m.registered("example.com/fpga", again=True)
    m.allocate_observed("example.com/fpga", 0.01, ok=True)
    m.prepare_observed("example.com/fpga", "fpga.example.com", 0.01, ok=True)
    m.unprepare_observed("example.com/fpga", "fpga.example.com", 0.01, ok=True)
    m.claims_prepared("example.com/fpga", "fpga.example.com", 1)
    m.slices_published("example.com/fpga", "fpga.example.com", ok=True)
    m.health_sent("example.com/fpga", "fpga.example.com")
    m.devices("example.com/fpga", 1, 1, {"xid": 1})
    m.preparation_failed("example.com/fpga")
    m.kubelet_restart()
    m.backend_started("fake")
    m.backend_down("example.com/fpga", False)
    from prometheus_client.parser import text_string_to_metric_families

    text = generate_latest(m.registry).decode()
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        name = family.name + ("_total" if family.type == "counter" else "")
        if family.name.endswith("_created"):
            continue
        labels = out.setdefault(name, set())
        for sample in family.samples:
            labels.update(k for k in sample.labels if k != "le")
    for line in text.splitlines():  # families without a sample yet (the tallies): their TYPE line
        m_ = re.match(r"# TYPE (\S+) (\S+)", line)
        if m_ and not m_.group(1).endswith("_created"):
            out.setdefault(m_.group(1), set())
    return out


def test_metrics_doc_names_every_metric_and_its_labels() -> None:
    doc = METRICS_DOC.read_text()
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `([a-z_:]+)` \|.*$", doc, re.M)}
    exposed = daemon_metrics()
    assert "cdiplug_unhealthy_devices" in exposed and "cdiplug_cdi_spec_write_failures_total" in exposed
    for name, labels in exposed.items():
        assert name in rows, f"docs/metrics.md does not describe {name}"
        for label in labels:
            assert f"`{label}`" in rows[name], f"docs/metrics.md: {name} does not name its label {label}"
    for name in rows:
        if not name.startswith("cdiplug:"):
            assert name in exposed, f"docs/metrics.md describes {name}, which the daemon does not export"


def dashboard_queries() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in board["panels"] for t in p["targets"]]


def test_dashboard_covers_what_operators_watch() -> None:
    board = json.loads(DASHBOARD.read_text())
    exprs = " ".join(dashboard_queries())
    for metric in (
        "cdiplug_devices",
        "cdiplug_allocations_total",
        "cdiplug_dra_claim_operations_total",
        "cdiplug_dra_claim_operation_duration_seconds_bucket",
        "cdiplug_backend_restarts_total",
        "cdiplug_dra_slice_publishes_total",
    ):
        assert metric in exprs, metric
    assert {v["name"] for v in board["templating"]["list"]} == {"datasource", "node"}
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("expr", dashboard_queries())
def test_dashboard_queries_select_by_node(expr: str) -> None:
    assert 'node=~"$node"' in expr
