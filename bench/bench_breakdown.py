#!/usr/bin/env python3
"""What cdiplug's start-up time and memory over the floor are made of, measured in one run.

``bench_daemon.py`` measures exec -> all registered and idle RSS for cdiplug and the floor. This
script splits cdiplug's excess into parts, each measured here the same way, one after the other:

- the floor's start and cdiplug's start (``exec -> last Register``, median of ``--starts``, 8
  resources x 128 devices, as ``bench_daemon.py``);
- imports alone, each set in a fresh ``python -c`` (exec -> imported, the garbage collector off,
  minimum of ``--runs``): what the floor imports; that plus the libraries cdiplug's house rules
  require before it can register (attrs for its value objects, cattrs for the one configuration
  converter; PyYAML only for a configuration that is not JSON, and the bench's is JSON, as the
  Helm chart's); and everything ``cdiplug serve`` with the fake backend has imported when it
  registers. Their differences are the libraries' and cdiplug's own import costs; what is left of
  the start gap is start-up work (the collector's passes over all that was loaded, reading the
  configuration, starting backends and servers, registering);
- Python heap (``tracemalloc``, after a full collection) and RSS of the same import sets.

The figure to read is ``start_ratio_with_libraries_alone``: the floor's start plus the required
libraries' import time, over the floor's start: the best ``start_registered_s`` ratio cdiplug could
reach if all of its own code cost nothing. Prints one JSON object; ``--table`` also a table on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import bench_daemon
import harness as h

FLOOR = ["asyncio", "argparse", "logging", "grpc", "grpc.aio", "cdiplug.api.deviceplugin_v1beta1_pb2_grpc"]
LIBRARIES = ["attrs", "cattrs"]
# What `cdiplug serve` with the fake backend has imported when it registers (the CDI builder comes
# later, in the spec writer's thread).
CDIPLUG = ["cdiplug.cli.serve", "cdiplug.daemon", "cdiplug_backends.fake.backend"]
SETS = {"python": [], "floor": FLOOR, "floor_and_libraries": FLOOR + LIBRARIES, "cdiplug": FLOOR + LIBRARIES + CDIPLUG}

# The garbage collector is off while the modules load, so the figures are the imports' own cost
# (its passes grow with everything loaded before, and would be charged to whatever came last);
# the time is taken in the child (CLOCK_MONOTONIC is the machine's) once the imports are done,
# before Python's teardown.
_MEASURE = """
import gc, os, sys, time, tracemalloc
gc.disable()
{imports}
done = time.monotonic()
gc.collect()
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
heap = tracemalloc.get_traced_memory()[0] if tracemalloc.is_tracing() else 0
print(done, int(status["VmRSS"].split()[0]), int(status["RssAnon"].split()[0]), heap, flush=True)
os._exit(0)
"""


def run_set(modules: list[str], tracing: bool) -> tuple[float, list[int]]:
    code = _MEASURE.format(imports="\n".join(f"import {m}" for m in modules))
    argv = [sys.executable, *(["-X", "tracemalloc"] if tracing else []), "-c", code]
    started = time.monotonic()
    done, *memory = subprocess.run(argv, check=True, capture_output=True, text=True, env=h.plugin_env()).stdout.split()
    return float(done) - started, [int(v) for v in memory]


def imports(runs: int) -> dict[str, dict[str, float]]:
    """Per set: seconds (minimum over ``runs``, alternating the sets), RSS and anon KiB, heap bytes."""
    times: dict[str, list[float]] = {name: [] for name in SETS}
    for modules in SETS.values():  # unmeasured: writes the bytecode the measured runs read
        run_set(modules, tracing=False)
    memory: dict[str, list[int]] = {}
    for run in range(runs):
        for name, modules in SETS.items() if run % 2 == 0 else reversed(SETS.items()):
            seconds, values = run_set(modules, tracing=False)
            times[name].append(seconds)
            memory.setdefault(name, values)
    out = {}
    for name, modules in SETS.items():
        _, (_, _, heap) = run_set(modules, tracing=True)
        rss, anon, _ = memory[name]
        out[name] = {"s": min(times[name]), "rss_mib": rss / 1024, "anon_mib": anon / 1024, "heap_mib": heap / 2**20}
    return out


async def starts(count: int) -> dict[str, float]:
    args = argparse.Namespace(resources=8, devices=128, numa_nodes=2)
    folder = Path(tempfile.mkdtemp(prefix="cdpk-"))
    try:
        h.use_bytecode_cache(folder / "pycache")
        for kind in ("floor", "cdiplug"):
            await bench_daemon.measure(args, folder, kind, full=False, run=-1)
        seen: dict[str, list[float]] = {"cdiplug": [], "floor": []}
        for run in range(count):
            for kind in ("floor", "cdiplug") if run % 2 == 0 else ("cdiplug", "floor"):
                seen[kind].append((await bench_daemon.measure(args, folder, kind, full=False, run=run))["registered_s"])
        return {kind: statistics.median(values) for kind, values in seen.items()}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def report(start: dict[str, float], imp: dict[str, dict[str, float]]) -> dict[str, Any]:
    floor, cdiplug = start["floor"], start["cdiplug"]
    libraries = imp["floor_and_libraries"]["s"] - imp["floor"]["s"]
    own_imports = imp["cdiplug"]["s"] - imp["floor_and_libraries"]["s"]
    gap = cdiplug - floor
    ms = {"digits": 1}

    def mem(kind: str, a: str, b: str) -> dict[str, Any]:
        return h.figure(imp[b][kind] - imp[a][kind], digits=2)

    figures: dict[str, Any] = {
        "start_registered_s": h.ratio_at_most(cdiplug, floor, bench_daemon.GOAL_START_RATIO),
        "start_gap_ms": h.figure(gap * 1000, **ms),
        "imports_floor_ms": h.figure((imp["floor"]["s"] - imp["python"]["s"]) * 1000, **ms),
        "imports_required_libraries_ms": h.figure(libraries * 1000, **ms, libraries=LIBRARIES),
        "imports_cdiplug_own_ms": h.figure(own_imports * 1000, **ms),
        "start_work_ms": h.figure((gap - libraries - own_imports) * 1000, **ms),
        "start_ratio_with_libraries_alone": h.figure((floor + libraries) / floor),
        "heap_required_libraries_mib": mem("heap_mib", "floor", "floor_and_libraries"),
        "heap_cdiplug_own_mib": mem("heap_mib", "floor_and_libraries", "cdiplug"),
        "rss_required_libraries_mib": mem("rss_mib", "floor", "floor_and_libraries"),
        "rss_cdiplug_own_imports_mib": mem("rss_mib", "floor_and_libraries", "cdiplug"),
    }
    return {"bench": "breakdown", "figures": figures, "missed": h.missed(figures)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=9, help="starts of each plugin (the median is the figure)")
    parser.add_argument("--runs", type=int, default=9, help="runs of each import set (the minimum is the figure)")
    parser.add_argument("--table", action="store_true", help="also print a human table on stderr")
    args = parser.parse_args()
    started = time.monotonic()
    result = report(asyncio.run(starts(args.starts)), imports(args.runs))
    return h.emit(result, result["figures"], show_table=args.table, started=started)


if __name__ == "__main__":
    sys.exit(main())
