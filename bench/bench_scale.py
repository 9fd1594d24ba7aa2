#!/usr/bin/env python3
"""Scale curve of one resource (fake backend, 4 NUMA nodes) against the floor plugin, same run.

For each size of ``--sizes`` (128, 1,024, 4,096 devices) the floor plugin (``floor_plugin.py``)
and ``python -m cdiplug serve`` serve one resource, ``example.com/bench0``, each measured the same
way against a fresh kubelet stand-in (see bench/README.md):

- ``start_registered_s``/``start_listed_s``: exec -> Register received / first list received;
- ``rss_idle_mib``: VmRSS 0.5 s after start; ``rss_after_load_mib``: after everything below;
- ``preferred_p50_ms``: GetPreferredAllocation of 8 out of every device; ``preferred_must_include_p50_ms``:
  the same with 2 devices (on NUMA nodes 1 and 2) that must be included;
- ``allocate_p50_ms``: one caller, one device per Allocate;
- ``health_update_ms_p50``/``_max`` (cdiplug only): one device flips in the health file (atomic
  rename) -> the stand-in receives the list showing it; ``--health-changes`` flips, each once the
  daemon is idle again (``stand_in_ms``: the stand-in's own share); ``health_burst_ms_p50``/``_max``:
  the same flips back to back, each as soon as the last arrived.

Prints one JSON object (``sizes`` keyed by device count); ``--table`` adds a table on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import harness as h

GOAL_START_RATIO = 1.7
GOAL_ALLOCATE_P50_RATIO = 1.1
GOAL_PREFERRED_MS = 10.0  # at 4,096 devices with must-include (and so below it)
PREFERRED_SIZE = 8


def rss_goal(devices: int) -> float | None:
    """MiB over the floor: 8 for 128 devices (stated for 8 x 128), 12 for 4,096; none between."""
    return 8.0 if devices <= 128 else 12.0 if devices == 4096 else None


def health_goal(devices: int) -> float | None:
    """ms: 10 at 128 devices, 50 up to 4,096 (stated at 4,096, so implied below it)."""
    return 10.0 if devices <= 128 else 50.0 if devices <= 4096 else None


async def warm_up(args: argparse.Namespace, folder: Path) -> None:
    """Start each plugin once, unmeasured, so the measured starts read their bytecode."""
    name = h.resources(1)[0]
    run_dir = folder / "warm-up"
    run_dir.mkdir()
    for kind, argv in (
        ("floor", h.floor_argv(folder / "k-warm-floor", 1, 8, args.numa_nodes)),
        ("cdiplug", h.cdiplug_argv(run_dir, h.write_config(run_dir, [name], 8, args.numa_nodes), folder / "k-warm-cdiplug")),
    ):
        async with h.running(kind, argv, folder / f"k-warm-{kind}", [name], folder / f"warm-{kind}.log"):
            pass


async def measure(args: argparse.Namespace, folder: Path, kind: str, devices: int) -> dict[str, Any]:
    name = h.resources(1)[0]
    kubelet_dir = folder / f"k-{kind}-{devices}"
    run_dir = folder / f"d-{devices}"
    if kind == "cdiplug":
        run_dir.mkdir()
        argv = h.cdiplug_argv(run_dir, h.write_config(run_dir, [name], devices, args.numa_nodes), kubelet_dir)
    else:
        argv = h.floor_argv(kubelet_dir, 1, devices, args.numa_nodes)
    raw: dict[str, Any] = {}
    async with h.running(kind, argv, kubelet_dir, [name], folder / f"{kind}-{devices}.log") as plugin:
        kubelet, pid = plugin.kubelet, plugin.pid
        raw["registered_s"], raw["listed_s"] = plugin.registered_s, plugin.listed_s
        await asyncio.sleep(h.SETTLE_S)
        raw["idle"] = h.rss(pid)
        ids = h.device_ids(name, devices)
        must = [ids[1 % devices], ids[2 % devices]] if args.numa_nodes >= 3 else ids[:2]
        await h.preferred_latency(kubelet, name, ids, (), PREFERRED_SIZE, 3)  # warm-up
        raw["preferred_p50_ms"] = statistics.median(
            await h.preferred_latency(kubelet, name, ids, (), PREFERRED_SIZE, args.preferred_calls)
        )
        raw["preferred_must_p50_ms"] = statistics.median(
            await h.preferred_latency(kubelet, name, ids, must, PREFERRED_SIZE, args.preferred_calls)
        )
        await h.allocate_latency(kubelet, name, ids, 50)  # warm-up
        raw["allocate_p50_ms"] = statistics.median(await h.allocate_latency(kubelet, name, ids, args.calls))
        if kind == "cdiplug" and args.health_changes:
            health = await h.health_latency(kubelet, run_dir, name, devices, args.health_changes, settle_pid=pid)
            raw["health_p50_ms"], raw["health_max_ms"] = statistics.median(health), max(health)
            burst = await h.health_latency(kubelet, run_dir, name, devices, args.health_changes)
            raw["burst_p50_ms"], raw["burst_max_ms"] = statistics.median(burst), max(burst)
            raw["stand_in_ms"] = h.stand_in_list_ms(devices, args.numa_nodes)
        raw["after_load"] = h.rss(pid)
    raw["exit_status"] = plugin.exit_status
    return raw


def report(devices: int, c: dict[str, Any], f: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    figures: dict[str, Any] = {
        "start_registered_s": h.ratio_at_most(c["registered_s"], f["registered_s"], GOAL_START_RATIO),
        "start_listed_s": h.figure(c["listed_s"], f["listed_s"]),
        "rss_idle_mib": h.floor_plus(c["idle"]["rss"], f["idle"]["rss"], rss_goal(devices)),
        "rss_anon_idle_mib": h.floor_plus(c["idle"]["anon"], f["idle"]["anon"], None),
        "rss_after_load_mib": h.floor_plus(
            c["after_load"]["rss"], f["after_load"]["rss"], None, growth=round(c["after_load"]["rss"] - c["idle"]["rss"], 2)
        ),
        "preferred_p50_ms": h.at_most(
            c["preferred_p50_ms"], GOAL_PREFERRED_MS if devices <= 4096 else None, "ms", f["preferred_p50_ms"]
        ),
        "preferred_must_include_p50_ms": h.at_most(
            c["preferred_must_p50_ms"], GOAL_PREFERRED_MS if devices <= 4096 else None, "ms", f["preferred_must_p50_ms"]
        ),
        "allocate_p50_ms": h.ratio_at_most(c["allocate_p50_ms"], f["allocate_p50_ms"], GOAL_ALLOCATE_P50_RATIO),
    }
    if "health_p50_ms" in c:
        figures["health_update_ms_p50"] = h.at_most(
            c["health_p50_ms"], health_goal(devices), "ms", changes=args.health_changes, stand_in_ms=round(c["stand_in_ms"], 2)
        )
        figures["health_update_ms_max"] = h.figure(c["health_max_ms"], digits=1)
        figures["health_burst_ms_p50"] = h.figure(c["burst_p50_ms"], digits=1, changes=args.health_changes)
        figures["health_burst_ms_max"] = h.figure(c["burst_max_ms"], digits=1)
    figures["exit_status"] = h.figure(
        c["exit_status"], None, goal="== 0", met=c["exit_status"] == 0, floor_exit_status=f["exit_status"]
    )
    return figures


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="cdps-"))
    try:
        sizes: dict[str, Any] = {}
        if not args.no_bytecode_cache:
            h.use_bytecode_cache(folder / "pycache")
            await warm_up(args, folder)
        for devices in args.sizes:
            floor = await measure(args, folder, "floor", devices)
            cdiplug = await measure(args, folder, "cdiplug", devices)
            sizes[str(devices)] = report(devices, cdiplug, floor, args)
        return {
            "bench": "scale",
            "bytecode_cache": not args.no_bytecode_cache,
            "resources": 1,
            "numa_nodes": args.numa_nodes,
            "preferred_size": PREFERRED_SIZE,
            "sizes": sizes,
            "missed": h.missed(sizes),
        }
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[128, 1024, 4096],
        help="comma-separated device counts (default 128,1024,4096)",
    )
    parser.add_argument("--numa-nodes", type=int, default=4)
    parser.add_argument("--calls", type=int, default=500, help="Allocates for the one-caller latency")
    parser.add_argument("--preferred-calls", type=int, default=50, help="GetPreferredAllocation calls of each kind")
    parser.add_argument("--health-changes", type=int, default=20, help="one-device health flips per size")
    parser.add_argument(
        "--no-bytecode-cache",
        action="store_true",
        help="start the plugins as the environment says (PYTHONDONTWRITEBYTECODE=1: compile from source each start)",
    )
    parser.add_argument("--table", action="store_true", help="also print a human table on stderr")
    args = parser.parse_args()
    started = time.monotonic()
    result = asyncio.run(bench(args))
    return h.emit(result, result["sizes"], show_table=args.table, started=started)


if __name__ == "__main__":
    sys.exit(main())
