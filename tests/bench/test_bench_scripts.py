"""The bench scripts still run and report every figure (a smoke test, not a timing test).

Speed and memory goals are judged by reading the printed figures, never here; this only keeps
the scripts from rotting as the code under them changes. Each runs as a subprocess with small
knobs, against the real daemon (bench_daemon) and a built sysfs tree (bench_pci_scan).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_bench(script: str, *args: str) -> dict:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *args], capture_output=True, text=True, timeout=240, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_bench_daemon_reports_every_figure() -> None:
    figures = run_bench(
        "bench_daemon.py",
        "--resources",
        "2",
        "--devices",
        "8",
        "--calls",
        "50",
        "--seconds",
        "0.5",
        "--restarts",
        "1",
        "--health-rounds",
        "2",
    )
    for key in (
        "start_s",
        "reregister_s",
        "allocate_ms_p50",
        "allocate_ms_p99",
        "allocate_per_s",
        "health_update_ms_p50",
        "rss_mib_idle",
        "rss_mib_after_load",
    ):
        assert isinstance(figures[key], (int, float)) and figures[key] > 0, key
    assert figures["exit_status"] == 0
    assert set(figures["missed"]) <= set(figures["goals"])


def test_bench_pci_scan_reports_the_scan_time() -> None:
    figures = run_bench("bench_pci_scan.py", "--pfs", "4", "--vfs", "8", "--runs", "2")
    assert figures["functions"] == 4 + 4 * 8  # the PFs and their VFs, all scanned
    assert figures["advertised"] > 0
    assert 0 < figures["scan_s"] <= figures["scan_s_max"]
    assert isinstance(figures["missed"], list)


def test_bench_dra_reports_every_figure() -> None:
    figures = run_bench("bench_dra.py", "--claims", "5", "--devices", "300")
    for key in ("prepare_ms_p50", "prepare_ms_p99", "unprepare_ms_p50", "unprepare_ms_p99", "slice_publish_s", "slice_republish_s"):
        assert isinstance(figures[key], (int, float)) and figures[key] > 0, key
    assert (figures["slices"], figures["devices_published"]) == (3, 300)  # 128 + 128 + 44, every device published
