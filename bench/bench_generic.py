#!/usr/bin/env python3
"""Benchmark of the generic backend: prints one JSON object of figures, each beside a floor
measured in the same run.

- ``hotplug_ms_p50`` / ``_p95``: a USB device unplugged (its sysfs folder and nodes removed, a
  udev ``remove`` event on a fake monitor) or plugged back (``add``) -> the kubelet stand-in's
  ListAndWatch list shows the change, through the daemon (in-process). Floor: the same daemon's
  fake backend, a health file replaced by rename -> the stand-in sees the change (the thinnest
  event-driven health path cdiplug has).
- ``peer``: the same for squat/generic-device-plugin (``--peer``, its binary), a node removed or
  made again -> its list at the stand-in: it polls every 5 s (not a figure: shown for comparison).
- ``discover_nodes_ms``: one group whose glob matches ``--nodes`` device nodes (made with mknod),
  scanned: every node found with its type, major and minor. Floor: ``os.scandir`` and ``stat`` of
  the same nodes.
- ``discover_usb_ms``: ``--usb`` USB devices in a fake sysfs tree, each with a tty node, matched by
  one selector: one device each with its raw and class nodes. Floor: reading each device's
  ``idVendor``, ``idProduct`` and ``serial`` and nothing else.
- ``rss_per_1000_devices_mib``: the daemon (``cdiplug serve``, a process of its own) serving
  ``--usb`` USB devices, less the same daemon serving none, per 1,000 devices. Floor: the floor
  plugin (``floor_plugin.py``) with as many devices, less with one.

Run: ``python bench/bench_generic.py [--nodes 1000] [--usb 1000] [--rounds 20] [--peer PATH] [--table]``.
Needs root (mknod). Nothing fails when a figure misses its goal; ``missed`` says so.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import harness

from cdiplug.config import parse_config
from cdiplug.models.world import World
from cdiplug.testing import KubeletStandIn, running_daemon
from cdiplug_backends.fake import plugin as fake_plugin
from cdiplug_backends.generic import make_plugin
from cdiplug_backends.generic.discovery import scan
from cdiplug_backends.generic.nodes import DevRoot
from cdiplug_backends.generic.options import GenericOptions, Group, PathEntry, UsbSelector
from cdiplug_backends.generic.testing import ClassNode, FakeDev, FakeUdevMonitor, UsbTree

PEER = Path("/work/shared/peers/generic-device-plugin")
USB_RESOURCE, FAKE_RESOURCE = "example.com/usbserial", "example.com/health"


def plug(usb: UsbTree, i: int) -> None:
    bus, n = 1 + i // 120, i % 120
    usb.plug(f"{bus}-{n + 1}", "0403", "6001", serial=f"SN{i:05d}", devnum=n + 2, nodes=[ClassNode("tty", f"ttyUSB{i}", 188, i)])


def port(i: int) -> str:
    return f"{1 + i // 120}-{i % 120 + 1}"


async def hotplug_latency(folder: Path, rounds: int) -> tuple[list[float], list[float]]:
    """(generic hotplug ms, fake health-file ms) per round, through one in-process daemon."""
    world = World(
        kubelet_dir=folder / "kubelet",
        cdi_dir=folder / "cdi",
        state_dir=folder / "state",
        sysfs_root=folder / "sys",
        dev_root=folder / "root",
        pod_resources_socket=folder / "pr.sock",
        node_name="bench",
    )
    for p in (world.kubelet_dir, world.cdi_dir, world.state_dir, world.sysfs_root):
        p.mkdir(parents=True, exist_ok=True)
    usb = UsbTree(world.sysfs_root, FakeDev(world.dev_root))
    plug(usb, 0)
    health = folder / "health.yaml"
    health.write_text("{}\n")
    monitor = FakeUdevMonitor()
    plugins = {"generic": make_plugin(udev_monitor=monitor), "fake": fake_plugin}
    config = parse_config(
        {
            "resources": [
                {"name": USB_RESOURCE, "backend": "generic", "options": {"groups": [{"usb": [{"vendor": "0403"}]}]}},
                {"name": FAKE_RESOURCE, "backend": "fake", "options": {"count": 1, "health_file": str(health)}},
            ]
        },
        "bench",
        plugins=plugins,
    )
    ours: list[float] = []
    floor: list[float] = []
    async with KubeletStandIn(world.kubelet_dir) as kubelet, running_daemon(config, world, plugins=plugins):
        for name in (USB_RESOURCE, FAKE_RESOURCE):
            await kubelet.wait_registered(name, timeout=30)
        await kubelet.wait_until(lambda: kubelet.allocatable(USB_RESOURCE) == 1, timeout=30)

        async def healthy(resource: str, want: int) -> None:
            await kubelet.wait_until(lambda: kubelet.allocatable(resource) == want, timeout=30)

        for n in range(rounds):
            up = n % 2 == 1
            started = time.perf_counter()
            if up:
                plug(usb, 0)
                monitor.emit("add", port(0), "usb")
            else:
                usb.unplug(port(0))
                monitor.emit("remove", port(0), "usb")
            await healthy(USB_RESOURCE, 1 if up else 0)
            ours.append((time.perf_counter() - started) * 1000)
            tmp = folder / "health.tmp"
            tmp.write_text("{}\n" if up else "health-0: Unhealthy\n")
            started = time.perf_counter()
            os.rename(tmp, health)
            await healthy(FAKE_RESOURCE, 1 if up else 0)
            floor.append((time.perf_counter() - started) * 1000)
    monitor.close()
    return ours, floor


async def peer_removal(peer: Path, folder: Path, rounds: int) -> list[float]:
    """ms from removing a node to generic-device-plugin's list without it, at the stand-in."""
    nodes = folder / "peer"
    nodes.mkdir()
    for i in range(2):
        os.mknod(nodes / f"n{i}", 0o666 | 0o020000, os.makedev(1, 3))
    kubelet_dir = folder / "peer-kubelet"
    kubelet_dir.mkdir()
    device = f'{{"name": "peer", "groups": [{{"paths": [{{"path": "{nodes}/n*"}}]}}]}}'
    argv = [str(peer), "--plugin-directory", str(kubelet_dir), "--domain", "example.com", "--device", device]
    times = []
    async with harness.running("peer", argv, kubelet_dir, ["example.com/peer"], folder / "peer.log") as plugin:
        for n in range(rounds):
            want = 1 if n % 2 == 0 else 2
            started = time.perf_counter()
            if want == 1:
                (nodes / "n1").unlink()
            else:
                os.mknod(nodes / "n1", 0o666 | 0o020000, os.makedev(1, 3))
            await plugin.kubelet.wait_until(lambda w=want: len(plugin.kubelet.devices("example.com/peer")) == w, timeout=30)
            times.append((time.perf_counter() - started) * 1000)
    return times


def discover_nodes(folder: Path, count: int, runs: int) -> tuple[float, float]:
    dev = FakeDev(folder / "nodes-root")
    for i in range(count):
        dev.node(f"/dev/bench/n{i:05d}", 1, 3)
    options = GenericOptions(groups=(Group(paths=(PathEntry(path="/dev/bench/n*"),)),))
    root = DevRoot(dev.root)
    ours, floor = [], []
    for _ in range(runs):
        started = time.perf_counter()
        result = scan(options, root, folder / "no-sys")
        ours.append(time.perf_counter() - started)
        started = time.perf_counter()
        found = [os.stat(e.path).st_rdev for e in os.scandir(dev.host("/dev/bench")) if e.name.startswith("n")]
        floor.append(time.perf_counter() - started)
    assert len(result.found[0].edits.device_nodes) == count == len(found)
    return statistics.median(ours) * 1000, statistics.median(floor) * 1000


def discover_usb(folder: Path, count: int, runs: int) -> tuple[float, float]:
    usb = UsbTree(folder / "usb-sys", FakeDev(folder / "usb-root"))
    for i in range(count):
        plug(usb, i)
    options = GenericOptions(groups=(Group(usb=(UsbSelector(vendor="0403"),)),))
    root = DevRoot(folder / "usb-root")
    ours, floor = [], []
    devices = usb.sysfs / "bus" / "usb" / "devices"
    for _ in range(runs):
        started = time.perf_counter()
        result = scan(options, root, usb.sysfs)
        ours.append(time.perf_counter() - started)
        started = time.perf_counter()
        ids = []
        for entry in os.scandir(devices):
            ids.append(tuple((Path(entry.path) / f).read_text() for f in ("idVendor", "idProduct", "serial")))
        floor.append(time.perf_counter() - started)
    assert len(result.found) == count == len(ids), (len(result.found), count)
    return statistics.median(ours) * 1000, statistics.median(floor) * 1000


async def rss_per_device(folder: Path, count: int) -> tuple[float, float]:
    """MiB per 1,000 devices: cdiplug serving ``count`` USB devices less none; the floor plugin likewise."""
    sysfs = folder / "usb-sys"
    out: dict[str, float] = {}
    for label, selector in (("many", {"vendor": "0403"}), ("none", {"vendor": "ffff"})):
        work = folder / f"rss-{label}"
        (work / "kubelet").mkdir(parents=True)
        config = work / "cdiplug.yaml"
        config.write_text(
            f"resources:\n  - name: {USB_RESOURCE}\n    backend: generic\n    register_when_empty: true\n"
            f'    options: {{groups: [{{usb: [{{vendor: "{selector["vendor"]}"}}]}}], rescan_interval: 3600}}\n'
        )
        argv = [
            *harness.cdiplug_argv(work, config, work / "kubelet"),
            "--sysfs-root",
            str(sysfs),
            "--dev-root",
            str(folder / "usb-root"),
        ]
        async with harness.running(f"cdiplug-{label}", argv, work / "kubelet", [USB_RESOURCE], work / "log") as plugin:
            await harness.settle(plugin.pid, 0.2)
            out[label] = harness.memory_mib(plugin.pid)
    for label, devices in (("floor-many", count), ("floor-one", 1)):
        kubelet_dir = folder / f"{label}-kubelet"
        kubelet_dir.mkdir()
        argv = harness.floor_argv(kubelet_dir, 1, devices, 0)
        async with harness.running(label, argv, kubelet_dir, ["example.com/bench0"], folder / f"{label}.log") as plugin:
            await harness.settle(plugin.pid, 0.2)
            out[label] = harness.memory_mib(plugin.pid)
    per = 1000 / count
    return (out["many"] - out["none"]) * per, max(out["floor-many"] - out["floor-one"], 0.01) * per


async def measure(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    ours, floor = await hotplug_latency(folder / "hotplug", args.rounds)
    nodes_ms, nodes_floor = discover_nodes(folder, args.nodes, args.runs)
    usb_ms, usb_floor = discover_usb(folder, args.usb, args.runs)
    rss, rss_floor = await rss_per_device(folder, args.usb)
    figures: dict[str, Any] = {
        "hotplug_ms_p50": harness.figure(statistics.median(ours), statistics.median(floor), digits=2),
        "hotplug_ms_p95": harness.figure(harness.percentile(ours, 95), harness.percentile(floor, 95), digits=2),
        "discover_nodes_ms": harness.figure(nodes_ms, nodes_floor, digits=2, nodes=args.nodes),
        "discover_usb_ms": harness.figure(usb_ms, usb_floor, digits=2, devices=args.usb),
        "rss_per_1000_devices_mib": harness.figure(rss, rss_floor, digits=2),
    }
    return figures


async def measure_peer(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    if not args.peer or not Path(args.peer).exists():
        return {}
    peer = await peer_removal(Path(args.peer), folder, args.peer_rounds)
    return {
        "project": "squat/generic-device-plugin",
        "removal_ms_p50": round(statistics.median(peer)),
        "removal_ms_max": round(max(peer)),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--usb", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--peer", default=str(PEER) if PEER.exists() else "", help="generic-device-plugin's binary ('' to skip)")
    parser.add_argument("--peer-rounds", type=int, default=4)
    parser.add_argument("--table", action="store_true")
    args = parser.parse_args()
    started = time.monotonic()
    folder = Path(tempfile.mkdtemp(prefix="cdp-generic-"))
    try:
        figures = asyncio.run(measure(args, folder))
        peer = asyncio.run(measure_peer(args, folder))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    result = {"figures": figures, "peer": peer, "missed": harness.missed(figures)}
    return harness.emit(result, figures, show_table=args.table, started=started)


if __name__ == "__main__":
    sys.exit(main())
