#!/usr/bin/env python3
"""Benchmark of the cdiplug daemon against Python's floor, measured in the same run (bench/README.md).

Two processes are measured the same way, one after the other, each against a fresh kubelet
stand-in (``cdiplug.testing.KubeletStandIn``, real gRPC over unix sockets in a temporary folder):
``python -m cdiplug serve`` with 8 fake resources of 128 devices, and ``bench/floor_plugin.py``,
the thinnest grpc.aio plugin serving the same resources, device IDs and topology. Every cdiplug
figure is printed beside the floor's and their ratio, with its goal and whether it
is met:

- ``start_registered_s``: exec -> last Register received (median of ``--starts``); ``start_listed_s``:
  exec -> every resource's first ListAndWatch list received;
- ``rss_idle_mib`` (and its anon/file parts): VmRSS 0.5 s after start;
- ``allocate_p50_ms``/``_p99_ms``: one caller, one device per Allocate;
- ``allocate_per_s``: 8 callers, one per resource; ``cpu_ms_per_allocate``: the plugin's own CPU;
- ``rss_growth_after_allocates_mib``: VmRSS after ``--mem-allocates`` (10,000) more Allocates, minus idle;
- ``rss_after_random_sets_mib``: ``--load-callers`` (16) callers Allocating random sets of 1-8 devices
  of random resources, three rounds of ``--load-allocates`` (2,000) each, VmRSS after each round;
  the figure is the third round minus the second (memory after a load stays flat);
- cdiplug only: ``health_update_ms_p50``/``_max`` over ``--health-rounds`` (20) isolated one-device
  flips, ``health_burst_ms_p50``/``_max`` over ``--health-changes`` (1,000) back-to-back flips and
  ``rss_growth_after_health_changes_mib`` over those, ``reregister_s`` after kubelet restarts.

Prints one JSON object; ``--table`` also prints a human table on stderr. Nothing fails when a goal
is missed: ``missed`` names those figures. About a minute with the defaults.
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

# The goals each figure is judged by.
GOAL_START_RATIO = 1.7
GOAL_RSS_OVER_FLOOR_MIB = 8.0
GOAL_ALLOCATE_P50_RATIO = 1.1
GOAL_ALLOCATE_RATE_RATIO = 0.9
GOAL_GROWTH_MIB = 1.0  # "no growth": what the floor grows by, and 1 MiB of allocator noise
GOAL_FLAT_MIB = 1.0  # memory after a load: the third round of random sets within this of the second
GOAL_HEALTH_MS_SMALL = 10.0  # at 128 devices a resource
GOAL_HEALTH_MS = 50.0  # up to 4,096
GOAL_REREGISTER_S = 0.1
LOAD_ROUNDS = 3


async def measure(args: argparse.Namespace, folder: Path, kind: str, full: bool, run: int) -> dict[str, Any]:
    """Start one plugin (``cdiplug`` or ``floor``); with ``full``, measure everything on it."""
    names = h.resources(args.resources)
    kubelet_dir = folder / f"k-{kind}-{run}"
    run_dir = folder / f"d-{run}"
    if kind == "cdiplug":
        run_dir.mkdir(exist_ok=True)
        argv = h.cdiplug_argv(run_dir, h.write_config(run_dir, names, args.devices, args.numa_nodes), kubelet_dir)
    else:
        argv = h.floor_argv(kubelet_dir, args.resources, args.devices, args.numa_nodes)
    raw: dict[str, Any] = {}
    async with h.running(kind, argv, kubelet_dir, names, folder / f"{kind}-{run}.log") as plugin:
        raw["registered_s"], raw["listed_s"] = plugin.registered_s, plugin.listed_s
        if not full:
            return raw
        kubelet, pid = plugin.kubelet, plugin.pid
        await asyncio.sleep(h.SETTLE_S)  # let start-up garbage settle before calling it idle
        raw["idle"] = h.rss(pid)

        ids = h.device_ids(names[0], args.devices)
        await h.allocate_latency(kubelet, names[0], ids, 100)  # warm-up
        lat = await h.allocate_latency(kubelet, names[0], ids, args.calls)
        raw["allocate_p50_ms"], raw["allocate_p99_ms"] = h.percentile(lat, 50), h.percentile(lat, 99)

        cpu_before = h.cpu_seconds(pid)
        calls, elapsed = await h.allocate_callers(kubelet, names, args.devices, seconds=args.seconds)
        raw["allocate_per_s"] = calls / elapsed
        raw["cpu_ms_per_allocate"] = (h.cpu_seconds(pid) - cpu_before) * 1000 / max(calls, 1)

        await h.allocate_callers(kubelet, names, args.devices, total=args.mem_allocates)
        raw["after_allocates"] = h.rss(pid)

        raw["load_rounds"] = []
        for load_round in range(LOAD_ROUNDS):
            await h.allocate_random_sets(
                kubelet, names, args.devices, callers=args.load_callers, total=args.load_allocates, seed=load_round
            )
            raw["load_rounds"].append(h.rss(pid)["rss"])

        if kind == "cdiplug":
            health = await h.health_latency(kubelet, run_dir, names[0], args.devices, args.health_rounds, settle_pid=pid)
            raw["health_p50_ms"], raw["health_max_ms"] = statistics.median(health), max(health)
            before_burst = h.rss(pid)
            burst = await h.health_latency(kubelet, run_dir, names[0], args.devices, args.health_changes)
            raw["burst_p50_ms"], raw["burst_max_ms"] = statistics.median(burst), max(burst)
            await h.settle(pid)
            raw["before_burst"], raw["after_health"] = before_burst, h.rss(pid)
            raw["stand_in_ms"] = h.stand_in_list_ms(args.devices, args.numa_nodes)
            rereg = []
            for _ in range(args.restarts):
                await kubelet.restart(wipe=True)
                assert kubelet.started_at is not None
                rereg.append(await h.all_listed(kubelet, names, kubelet.started_at) - kubelet.started_at)
            raw["reregister_s"] = rereg
    raw["exit_status"] = plugin.exit_status
    return raw


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="cdpb-"))
    try:
        starts: dict[str, list[float]] = {"cdiplug": [], "floor": []}
        listed: dict[str, list[float]] = {"cdiplug": [], "floor": []}
        raw: dict[str, dict[str, Any]] = {}
        if not args.no_bytecode_cache:
            h.use_bytecode_cache(folder / "pycache")
            for kind in ("floor", "cdiplug"):  # unmeasured: writes the bytecode the measured starts read
                await measure(args, folder, kind, full=False, run=-1)
        for run in range(args.starts):
            # Alternate which goes first, so neither always meets a warmer page cache.
            order = ("floor", "cdiplug") if run % 2 == 0 else ("cdiplug", "floor")
            for kind in order:
                result = await measure(args, folder, kind, full=run == args.starts - 1, run=run)
                starts[kind].append(result["registered_s"])
                listed[kind].append(result["listed_s"])
                if "idle" in result:
                    raw[kind] = result
        return report(args, starts, listed, raw["cdiplug"], raw["floor"])
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def report(
    args: argparse.Namespace, starts: dict[str, list[float]], listed: dict[str, list[float]], c: dict[str, Any], f: dict[str, Any]
) -> dict[str, Any]:
    health_goal = GOAL_HEALTH_MS_SMALL if args.devices <= 128 else GOAL_HEALTH_MS if args.devices <= 4096 else None
    growth_alloc = c["after_allocates"]["rss"] - c["idle"]["rss"]
    # grpc's and the allocator's buffers grow the floor too (about 1 MiB over 10,000 calls):
    # what cdiplug adds beyond that is what it keeps.
    floor_growth = max(0.0, f["after_allocates"]["rss"] - f["idle"]["rss"])
    growth_health = c["after_health"]["rss"] - c["before_burst"]["rss"]
    rounds, floor_rounds = c["load_rounds"], f["load_rounds"]
    flat = rounds[2] - rounds[1]
    figures: dict[str, Any] = {
        "start_registered_s": h.ratio_at_most(
            statistics.median(starts["cdiplug"]),
            statistics.median(starts["floor"]),
            GOAL_START_RATIO,
            each={k: [round(v, 3) for v in vs] for k, vs in starts.items()},
        ),
        "start_listed_s": h.figure(statistics.median(listed["cdiplug"]), statistics.median(listed["floor"])),
        "rss_idle_mib": h.floor_plus(c["idle"]["rss"], f["idle"]["rss"], GOAL_RSS_OVER_FLOOR_MIB),
        "rss_anon_idle_mib": h.floor_plus(c["idle"]["anon"], f["idle"]["anon"], None),
        "rss_file_idle_mib": h.floor_plus(c["idle"]["file"], f["idle"]["file"], None),
        "allocate_p50_ms": h.ratio_at_most(c["allocate_p50_ms"], f["allocate_p50_ms"], GOAL_ALLOCATE_P50_RATIO),
        "allocate_p99_ms": h.figure(c["allocate_p99_ms"], f["allocate_p99_ms"]),
        "allocate_per_s": h.ratio_at_least(c["allocate_per_s"], f["allocate_per_s"], GOAL_ALLOCATE_RATE_RATIO, digits=0),
        "cpu_ms_per_allocate": h.figure(c["cpu_ms_per_allocate"], f["cpu_ms_per_allocate"]),
        "rss_growth_after_allocates_mib": h.figure(
            growth_alloc,
            goal=f"<= floor growth + {GOAL_GROWTH_MIB} MiB",
            met=growth_alloc <= floor_growth + GOAL_GROWTH_MIB,
            digits=2,
            allocates=args.mem_allocates,
            floor_growth=round(floor_growth, 2),
        ),
        "rss_growth_after_health_changes_mib": h.figure(
            growth_health,
            goal=f"<= {GOAL_GROWTH_MIB} MiB",
            met=growth_health <= GOAL_GROWTH_MIB,
            digits=2,
            health_changes=args.health_changes,
        ),
        "rss_after_random_sets_mib": h.figure(
            flat,
            goal=f"<= {GOAL_FLAT_MIB} MiB (third round - second)",
            met=flat <= GOAL_FLAT_MIB,
            digits=2,
            rounds=[round(r, 1) for r in rounds],
            floor_rounds=[round(r, 1) for r in floor_rounds],
            callers=args.load_callers,
            allocates_per_round=args.load_allocates,
        ),
        "rss_after_load_mib": h.floor_plus(c["after_health"]["rss"], f["after_allocates"]["rss"], None),
        "health_update_ms_p50": h.at_most(
            c["health_p50_ms"], health_goal, "ms", changes=args.health_rounds, stand_in_ms=round(c["stand_in_ms"], 2)
        ),
        "health_update_ms_max": h.figure(c["health_max_ms"], digits=1),
        "health_burst_ms_p50": h.figure(c["burst_p50_ms"], digits=1, changes=args.health_changes),
        "health_burst_ms_max": h.figure(c["burst_max_ms"], digits=1),
        "reregister_s": h.at_most(max(c["reregister_s"]), GOAL_REREGISTER_S, "s", each=[round(r, 3) for r in c["reregister_s"]]),
        "exit_status": h.figure(
            c["exit_status"], None, goal="== 0", met=c["exit_status"] == 0, floor_exit_status=f["exit_status"]
        ),
    }
    return {
        "bench": "daemon",
        "resources": args.resources,
        "devices_per_resource": args.devices,
        "numa_nodes": args.numa_nodes,
        "bytecode_cache": not args.no_bytecode_cache,
        "figures": figures,
        "missed": h.missed(figures),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resources", type=int, default=8)
    parser.add_argument("--devices", type=int, default=128, help="devices per resource")
    parser.add_argument("--numa-nodes", type=int, default=2)
    parser.add_argument("--starts", type=int, default=3, help="starts of each plugin (the median is the figure)")
    parser.add_argument("--calls", type=int, default=2000, help="Allocates for the one-caller latency")
    parser.add_argument("--seconds", type=float, default=3.0, help="how long the 8 callers run")
    parser.add_argument("--mem-allocates", type=int, default=10_000, help="Allocates before the memory-growth reading")
    parser.add_argument("--load-callers", type=int, default=16, help="callers Allocating random device sets")
    parser.add_argument("--load-allocates", type=int, default=2000, help="random-set Allocates per round (three rounds)")
    parser.add_argument("--health-rounds", type=int, default=20, help="isolated one-device health flips (latency)")
    parser.add_argument("--health-changes", type=int, default=1000, help="back-to-back health flips (burst latency, memory)")
    parser.add_argument("--restarts", type=int, default=3, help="kubelet restarts to time")
    parser.add_argument(
        "--no-bytecode-cache",
        action="store_true",
        help="start the plugins as the environment says (PYTHONDONTWRITEBYTECODE=1: compile from source each start)",
    )
    parser.add_argument("--table", action="store_true", help="also print a human table on stderr")
    args = parser.parse_args()
    started = time.monotonic()
    result = asyncio.run(bench(args))
    return h.emit(result, result["figures"], show_table=args.table, started=started)


if __name__ == "__main__":
    sys.exit(main())
