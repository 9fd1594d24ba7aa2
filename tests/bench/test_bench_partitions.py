"""bench/bench_dra_partitions.py still runs and reports every figure (a smoke test, not a timing test).

Runs the script as a subprocess with few rounds, against the real publisher and the API-server
stand-in; checks that the partitioned pool was published as expected (one device cut into
1, 2 and 4 parts: 7 partitions, a counter slice beside the device slice) and that each figure has
cdiplug's value, the floor's and their ratio. Values are never judged.
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


def test_bench_dra_partitions_reports_every_figure() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench/bench_dra_partitions.py"), "--rounds", "4", "--profiles", "1,2,4"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    figures = json.loads(proc.stdout)
    assert (figures["partitions"], figures["counter_sets"], figures["slices"], figures["floor_slices"]) == (7, 1, 2, 1)
    for key in ("partitions_publish_ms_p50", "partitions_publish_ms_p99"):
        fig = figures[key]
        assert fig["cdiplug"] > 0 and fig["floor"] > 0, (key, fig)
        assert math.isclose(fig["ratio"], fig["cdiplug"] / fig["floor"], rel_tol=0.02, abs_tol=0.002), (key, fig)
        assert fig["goal"] is None and fig["met"] is None
