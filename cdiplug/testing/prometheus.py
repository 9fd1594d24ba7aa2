"""A real Prometheus for tests: Debian's ``prometheus`` binary on loopback, its own data folder,
scraping given targets every second with given rule files, evaluated every second.

``with RealPrometheus(tmp, targets, rule_files, labels) as prom:`` starts it and waits until it
is ready; ``prom.query(expr)``, ``prom.alerts(name)`` and ``prom.api(path)`` read its HTTP API.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import yaml


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RealPrometheus:
    def __init__(
        self,
        folder: Path,
        targets: Sequence[str],
        rule_files: Sequence[Path],
        labels: Mapping[str, str] | None = None,
        job: str = "cdiplug",
        start_timeout: float = 60.0,
    ) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            raise AssertionError("prometheus is missing: apt-get install prometheus (hack/test.sh installs it)")
        self.binary = binary
        self.folder = folder
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.start_timeout = start_timeout
        self.config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": [{"job_name": job, "static_configs": [{"targets": list(targets), "labels": dict(labels or {})}]}],
        }
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.folder / "prometheus.log"

    def __enter__(self) -> RealPrometheus:
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / "prometheus.yml").write_text(yaml.safe_dump(self.config))
        self._log = self.log_path.open("wb")
        self._process = subprocess.Popen(
            [
                self.binary,
                f"--config.file={self.folder / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.folder / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + self.start_timeout
        while not self._ready():
            if self._process.poll() is not None:
                raise AssertionError(f"prometheus exited ({self._process.returncode}): {self.log_path.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"prometheus was not ready within {self.start_timeout:g}s: {self.log_path.read_text()[-2000:]}"
                )
            time.sleep(0.2)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(20)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        if self._log is not None:
            self._log.close()

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    def api(self, path: str, **params: str) -> Any:
        """The JSON answer of ``GET path?params`` (an error's JSON body too)."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        try:
            with urllib.request.urlopen(self.url + path + query, timeout=10) as answer:
                return json.load(answer)
        except urllib.error.HTTPError as err:
            return json.load(err)

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The series of an instant query; AssertionError naming the query when it fails."""
        answer = self.api("/api/v1/query", query=expr)
        if answer.get("status") != "success":
            raise AssertionError(f"{expr}: {answer.get('errorType')}: {answer.get('error')}")
        result: list[dict[str, Any]] = answer["data"]["result"]
        return result

    def alerts(self, name: str) -> list[dict[str, Any]]:
        """The active (pending or firing) alerts named ``name``."""
        return [a for a in self.api("/api/v1/alerts")["data"]["alerts"] if a["labels"]["alertname"] == name]

    def alerting_rules(self) -> set[str]:
        return {r["name"] for g in self.api("/api/v1/rules")["data"]["groups"] for r in g["rules"] if r["type"] == "alerting"}
