"""A real Prometheus (Debian's ``prometheus`` package, on loopback, its own data folder) scrapes a
running daemon (the fake backend, a DRA resource and a device-plugin one, against the kubelet and
API server stand-ins) with the shipped rule file loaded, as is:

- a device made Unhealthy: CdiplugDevicesUnhealthy is pending in Prometheus' API at once, firing
  once its ``for`` (1m) has passed; the device Healthy again: the alert is gone (resolved);
- every query of the shipped dashboard parses and returns series for that daemon.

The moments of each step are printed (``-s`` shows them). The same on the local cluster, against
the DaemonSet's pod: tests/cluster/test_prometheus.py."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cdiplug.config import Config
from cdiplug.models.world import World
from cdiplug.testing import ApiServerStandIn, DraKubeletStandIn, KubeletStandIn
from cdiplug.testing.daemon import running_daemon
from cdiplug.testing.dra_objects import allocated_claim, claim_ref
from cdiplug.testing.poll import eventually
from cdiplug.testing.prometheus import RealPrometheus, free_port

# a real Prometheus and an alert's 1 m "for": over a minute (hack/test.sh --fast leaves it out)
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
RULES = ROOT / "deploy" / "prometheus" / "cdiplug-rules.yaml"
DASHBOARD = ROOT / "deploy" / "prometheus" / "cdiplug-dashboard.json"
DRIVER = "fpga.example.com"
DONGLE = "example.com/dongle"
NODE = "node-a"
UID = "11111111-2222-3333-4444-555555555555"
ALERT = "CdiplugDevicesUnhealthy"


async def poll(what: str, check: Callable[[], Any], timeout: float) -> Any:
    """``check()`` (a query: in a thread) every half second until it gives something true; its value."""
    return await eventually(check, what, timeout=timeout, interval=0.5, in_thread=True)


def stamp() -> str:
    return time.strftime("%H:%M:%S", time.gmtime()) + "Z"


async def test_health_alert_fires_and_resolves_and_the_dashboard_has_data(
    config: Config, dra_world: World, api: ApiServerStandIn, health_file: Path, tmp_path: Path
) -> None:
    target = free_port()
    with RealPrometheus(tmp_path / "prometheus", [f"127.0.0.1:{target}"], [RULES], {"node": NODE}) as prom:
        assert ALERT in prom.alerting_rules()
        async with (
            KubeletStandIn(dra_world.kubelet_dir) as dp_kubelet,
            DraKubeletStandIn(dra_world.plugins_registry_dir) as kubelet,
            running_daemon(config, dra_world, metrics_address=f"127.0.0.1:{target}"),
        ):
            conn = await asyncio.wait_for(kubelet.wait_registered(DRIVER), 10)
            await dp_kubelet.wait_registered(DONGLE, timeout=10)
            await dp_kubelet.allocate(DONGLE, ["dongle-0"])
            obj = api.put_claim(allocated_claim(UID, [("fpga", "fpga-1")], driver=DRIVER, pool=NODE))
            assert (await conn.prepare([claim_ref(obj)]))[UID].error == ""
            await poll("the daemon to be scraped", lambda: prom.query('up{job="cdiplug"} == 1'), 30)
            assert not prom.alerts(ALERT)

            health_file.write_text("fpga-1: Unhealthy\n")
            made = time.monotonic()
            print(f"{stamp()} fpga-1 made Unhealthy")
            pending = await poll(
                "the alert to be pending", lambda: [a for a in prom.alerts(ALERT) if a["state"] == "pending"], 30
            )
            print(f"{stamp()} {ALERT} pending after {time.monotonic() - made:.1f}s: {pending[0]['labels']}")
            labels = pending[0]["labels"]
            assert labels["resource"] == "example.com/fpga" and labels["node"] == NODE and labels["cause"] == "unhealthy"
            assert "on node node-a" in pending[0]["annotations"]["description"]
            firing = await poll("the alert to fire", lambda: [a for a in prom.alerts(ALERT) if a["state"] == "firing"], 120)
            print(f"{stamp()} {ALERT} firing after {time.monotonic() - made:.1f}s (activeAt {firing[0]['activeAt']})")

            health_file.write_text("fpga-1: Healthy\n")
            healed = time.monotonic()
            await poll("the alert to resolve", lambda: not prom.alerts(ALERT), 60)
            print(f"{stamp()} {ALERT} resolved {time.monotonic() - healed:.1f}s after recovery")

            board = json.loads(DASHBOARD.read_text())
            for panel in board["panels"]:
                for t in panel["targets"]:
                    expr = t["expr"].replace("$node", ".*")
                    await poll(f"series for {panel['title']!r}: {expr}", lambda expr=expr: prom.query(expr), 30)
