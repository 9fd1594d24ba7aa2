#!/usr/bin/env python3
"""Benchmark of the PCI backend's sysfs scan: prints one JSON object of figures.

Builds a fake sysfs tree (``cdiplug_backends.pci.testing.SysfsTree``) of 4096 PCI functions in a temporary
folder: 64 SR-IOV PFs (i40e, one netdev each, NUMA 0/1 alternating) with 63 VFs each (iavf, one
netdev each), every function in its own IOMMU group. Then it measures:

- ``scan_s``: ``PciSysfs.scan()`` of the whole tree (median of ``--runs``; ``scan_s_first`` is the
  first run, ``scan_s_max`` the slowest) — goal ≤ 0.5 s;
- ``rescan_s``: what the backend does on each udev event or timer tick: scan, read the state
  folder, select for one VFIO resource (every VF) and build its snapshot — median.

Run: ``python bench/bench_pci_scan.py [--pfs 64] [--vfs 63] [--runs 7]``. Nothing fails when a
figure misses its goal; ``missed`` says so.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from cdiplug.config import parse_config
from cdiplug_backends.pci import plugin
from cdiplug_backends.pci.discovery import select_all, to_snapshot
from cdiplug_backends.pci.journal import Journal
from cdiplug_backends.pci.sysfs import PciSysfs
from cdiplug_backends.pci.testing import SysfsTree

GOAL_S = 0.5


def build(root: Path, pfs: int, vfs: int) -> int:
    tree = SysfsTree(root / "sys", root / "dev")
    tree.enable_vfio()
    per_pf = vfs + 1
    addresses = [f"0000:{0x10 + i // 256:02x}:{(i % 256) // 8:02x}.{i % 8}" for i in range(pfs * per_pf)]
    group = 0
    for p in range(pfs):
        pf, *children = addresses[p * per_pf : (p + 1) * per_pf]
        tree.add_function(
            pf, vendor=0x8086, device=0x1572, driver="i40e", iommu_group=group, numa_node=p % 2, netdevs=[f"ens{p}f0"]
        )
        tree.add_vfs(pf, children, device=0x154C, driver="iavf", first_group=group + 1, netdev_prefix=f"ens{p}f0")
        group += per_pf
    return len(addresses)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pfs", type=int, default=64)
    parser.add_argument("--vfs", type=int, default=63)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="cdp-bench-"))
    try:
        t0 = time.perf_counter()
        count = build(root, args.pfs, args.vfs)
        build_s = time.perf_counter() - t0
        sysfs = PciSysfs(root / "sys")
        scans = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            topology = sysfs.scan()
            scans.append(time.perf_counter() - t0)
        assert len(topology.functions) == count, (len(topology.functions), count)

        config = parse_config(
            {
                "resources": [
                    {"name": "example.com/vf", "backend": "pci", "options": {"selectors": [{"device": "0x154c"}], "vfio": True}}
                ]
            },
            "bench",
            plugins={"pci": plugin},
        )
        resource = config.resources[0]
        journal = Journal(root / "state")
        rescans = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            topology = sysfs.scan()
            journal.all_bound()
            selection = select_all(topology, config.resources, {}, False)[resource.name]
            snapshot = to_snapshot(selection, resource.options, topology)
            rescans.append(time.perf_counter() - t0)
        scan_s = statistics.median(scans)
        figures = {
            "functions": count,
            "advertised": len(snapshot.devices),
            "build_s": round(build_s, 3),
            "scan_s": round(scan_s, 4),
            "scan_s_first": round(scans[0], 4),
            "scan_s_max": round(max(scans), 4),
            "rescan_s": round(statistics.median(rescans), 4),
            "goal_scan_s": GOAL_S,
            "missed": [] if scan_s <= GOAL_S else [f"scan_s {scan_s:.3f} > {GOAL_S}"],
        }
        print(json.dumps(figures, indent=2))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
