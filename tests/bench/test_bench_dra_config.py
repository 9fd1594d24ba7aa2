"""bench/bench_dra_config.py still runs and reports every figure (a smoke test, not a timing test).

Run as a subprocess with 3 claims of each kind against the real daemon and the stand-ins; each
figure must be well-formed (cdiplug's number, the plain prepare's floor measured in the same run,
their quotient as the ratio, a goal and whether it is met); the values are not judged.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # runs a bench script: seconds (hack/test.sh --fast leaves it out)

ROOT = Path(__file__).resolve().parents[2]


def test_bench_dra_config_reports_every_figure() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_dra_config.py"), "--claims", "3"],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    figures = json.loads(proc.stdout)
    assert figures["claims_per_kind"] == 3
    for kind in ("configured", "admin", "shared"):
        for q in ("p50", "p99"):
            fig = figures[f"{kind}_prepare_ms_{q}"]
            assert all(isinstance(fig[k], float) and math.isfinite(fig[k]) and fig[k] > 0 for k in ("cdiplug", "floor", "ratio"))
            assert math.isclose(fig["ratio"], fig["cdiplug"] / fig["floor"], rel_tol=0.02)
            assert (fig["goal"] is None) == (fig["met"] is None)
    assert isinstance(figures["missed"], list)
