"""A real Prometheus (Debian's ``prometheus`` package, on loopback, its own data folder) scrapes a
running daemon (the fake backend, a DRA resource and a device-plugin one, against the kubelet and
API server stand-ins) with the shipped rule file loaded, as is:

- a device made Unhealthy: CdiplugDevicesUnhealthy is pending in Prometheus' API at once, firing
  once its ``for`` (1m) has passed; the device Healthy again: the alert is gone (resolved);
- every query of the shipped dashboard parses and returns series for that daemon.

The moments of each step are printed (``-s`` shows them)."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdiplug.config import Config
from cdiplug.models.world import World
from cdiplug.testing import ApiServerStandIn, DraKubeletStandIn, KubeletStandIn
from cdiplug.testing.daemon import running_daemon
from cdiplug.testing.dra_objects import allocated_claim, claim_ref

ROOT = Path(__file__).resolve().parents[3]
RULES = ROOT / "deploy" / "prometheus" / "cdiplug-rules.yaml"
DASHBOARD = ROOT / "deploy" / "prometheus" / "cdiplug-dashboard.json"
DRIVER = "fpga.example.com"
DONGLE = "example.com/dongle"
NODE = "node-a"
UID = "11111111-2222-3333-4444-555555555555"
ALERT = "CdiplugDevicesUnhealthy"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Prometheus:
    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}"

    def get(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        try:
            with urllib.request.urlopen(self.url + path + query, timeout=10) as answer:
                body = json.load(answer)
        except urllib.error.HTTPError as err:
            body = json.load(err)
        return body

    def alerts(self, name: str) -> list[dict[str, Any]]:
        return [a for a in self.get("/api/v1/alerts")["data"]["alerts"] if a["labels"]["alertname"] == name]


async def poll(what: str, check: Callable[[], Any], timeout: float) -> Any:
    """``check()`` (in a thread) until it gives something true; its value. Bounded."""
    deadline = time.monotonic() + timeout
    while True:
        got = await asyncio.to_thread(check)
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(0.5)


@pytest.fixture
async def prometheus(tmp_path: Path) -> AsyncIterator[tuple[Prometheus, int]]:
    """A real Prometheus scraping 127.0.0.1:<metrics port> every second, the shipped rules loaded."""
    binary = shutil.which("prometheus")
    assert binary, "prometheus is missing: apt-get install prometheus (hack/test.sh installs it)"
    target, port = free_port(), free_port()
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [
            {
                "job_name": "cdiplug",
                "static_configs": [{"targets": [f"127.0.0.1:{target}"], "labels": {"node": NODE}}],
            }
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    log = (tmp_path / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    prom = Prometheus(port)
    try:

        def ready() -> bool:
            if process.poll() is not None:
                raise AssertionError("prometheus exited: " + (tmp_path / "prometheus.log").read_text()[-2000:])
            try:
                with urllib.request.urlopen(prom.url + "/-/ready", timeout=2) as answer:
                    return bool(answer.status == 200)
            except OSError:
                return False

        await poll("prometheus to be ready", ready, 60)
        rules = prom.get("/api/v1/rules")["data"]["groups"]
        assert {r["name"] for g in rules for r in g["rules"] if r["type"] == "alerting"} >= {ALERT}
        yield prom, target
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def stamp() -> str:
    return time.strftime("%H:%M:%S", time.gmtime()) + "Z"


async def test_health_alert_fires_and_resolves_and_the_dashboard_has_data(
    config: Config, dra_world: World, api: ApiServerStandIn, health_file: Path, prometheus: tuple[Prometheus, int]
) -> None:
    prom, target = prometheus
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

        def scraped() -> bool:
            up = prom.get("/api/v1/query", query='up{job="cdiplug"} == 1')["data"]["result"]
            return bool(up)

        await poll("the daemon to be scraped", scraped, 30)
        assert not prom.alerts(ALERT)

        health_file.write_text("fpga-1: Unhealthy\n")
        made = time.monotonic()
        print(f"{stamp()} fpga-1 made Unhealthy")
        pending = await poll("the alert to be pending", lambda: [a for a in prom.alerts(ALERT) if a["state"] == "pending"], 30)
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

                def has_series(expr: str = expr) -> Any:
                    answer = prom.get("/api/v1/query", query=expr)
                    assert answer["status"] == "success", f"{panel['title']}: {expr}: {answer.get('error')}"
                    return answer["data"]["result"]

                await poll(f"series for {panel['title']!r}: {expr}", has_series, 30)
