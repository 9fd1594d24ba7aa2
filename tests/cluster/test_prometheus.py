"""A real Prometheus, started here on the host, scrapes the DaemonSet pod's metrics port on the
local cluster (cdiplug from deploy/overlays/fake) with the shipped rule file loaded: a device made
Unhealthy on the node puts CdiplugDevicesUnhealthy pending, then firing after its ``for``; the
device Healthy again resolves it. Every dashboard query returns series for the pod."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cdiplug.testing.prometheus import RealPrometheus

from .conftest import HEALTH_FILE, write_health

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "prometheus" / "cdiplug-rules.yaml"
DASHBOARD = REPO / "deploy" / "prometheus" / "cdiplug-dashboard.json"
ALERT = "CdiplugDevicesUnhealthy"


def poll(what: str, check: Callable[[], Any], timeout: float) -> Any:
    """``check()`` until it gives something true; its value. Bounded (Prometheus has no watch)."""
    deadline = time.monotonic() + timeout
    while not (got := check()):
        assert time.monotonic() < deadline, f"timed out after {timeout:g}s waiting for {what}"
        time.sleep(0.5)
    return got


def test_health_alert_on_the_daemonset_pod(kube: Any, cdiplug: dict[str, Any], tmp_path: Path) -> None:
    pod = kube.daemon_pod()
    target = f"{pod['status']['podIP']}:9765"
    labels = {"node": pod["spec"]["nodeName"]}
    try:
        with RealPrometheus(tmp_path / "prometheus", [target], [RULES], labels) as prom:
            poll("the pod to be scraped", lambda: prom.query('up{job="cdiplug"} == 1'), 60)
            assert not prom.alerts(ALERT)
            write_health("fpga-1: Unhealthy\n")
            made = time.monotonic()
            pending = poll("the alert to be pending", lambda: prom.alerts(ALERT), 60)
            assert pending[0]["labels"]["node"] == kube.node and pending[0]["labels"]["resource"] == "example.com/fpga"
            print(f"pending after {time.monotonic() - made:.1f}s")
            poll("the alert to fire", lambda: [a for a in prom.alerts(ALERT) if a["state"] == "firing"], 150)
            print(f"firing after {time.monotonic() - made:.1f}s")
            write_health("fpga-1: Healthy\n")
            healed = time.monotonic()
            poll("the alert to resolve", lambda: not prom.alerts(ALERT), 60)
            print(f"resolved {time.monotonic() - healed:.1f}s after recovery")
            board = json.loads(DASHBOARD.read_text())
            for panel in board["panels"]:
                for t in panel["targets"]:
                    expr = t["expr"].replace("$node", ".*")
                    if "cdiplug_dra_" in expr:
                        continue  # the fake overlay serves no DRA driver (tests/integration/dra/test_prometheus.py does)
                    poll(f"series for {panel['title']!r}: {expr}", lambda expr=expr: prom.query(expr), 30)
    finally:
        HEALTH_FILE.unlink(missing_ok=True)
