#!/usr/bin/env python3
"""Benchmark of the cdiplug daemon: prints one JSON object of figures (see bench/README.md).

A real ``python -m cdiplug serve`` process serves 8 resources of 128 fake devices each to the
kubelet stand-in of ``cdiplug.testing`` (real gRPC over unix sockets in a temporary folder):

- ``start_s``: spawning the process -> every resource registered and listed;
- ``reregister_s``: the stand-in restarting with its folder wiped (new kubelet.sock served) ->
  every resource registered and listed again (worst of a few restarts);
- ``allocate_ms``: p50/p99 of Allocate (one device) with one caller;
- ``allocate_per_s``: Allocates per second with 8 concurrent callers, one per resource;
- ``health_update_ms``: health file written -> the new list received over ListAndWatch;
- ``daemon_cpu_ms_per_allocate``: the daemon's own CPU time per Allocate under that load;
- ``rss_mib``: VmRSS of the daemon, idle after start and after the load (and its anon/file parts).

The caller is Python (the stand-in) in this process, so Allocate figures include its client
overhead; ``client_floor_ms`` measures that overhead against a do-nothing plugin in-process.
Run: ``python bench/bench_daemon.py [--resources 8] [--devices 128] [--calls 2000]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import grpc

from cdiplug.api import deviceplugin_v1beta1_pb2 as pb
from cdiplug.api import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from cdiplug.testing import KubeletStandIn

GOALS = {
    "start_s": 0.5,
    "reregister_s": 0.5,
    "allocate_ms_p99": 5.0,
    "allocate_per_s": 2000,
    "health_update_ms": 50.0,
    "rss_mib": 45.0,
}
TIMEOUT = 30.0


def resources(count: int) -> list[str]:
    return [f"example.com/bench{i}" for i in range(count)]


def device_ids(resource: str, devices: int) -> list[str]:
    cls = resource.rpartition("/")[2]
    return [f"{cls}-{i}" for i in range(devices)]


def write_config(folder: Path, names: Sequence[str], devices: int) -> Path:
    lines = ["resources:"]
    for name in names:
        health = folder / "health" / f"{name.rpartition('/')[2]}.yaml"
        lines += [
            f"  - name: {name}",
            "    backend: fake",
            f"    options: {{count: {devices}, numa_nodes: [0, 1], health_file: {health}}}",
        ]
    path = folder / "config.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def write_health(folder: Path, resource: str, unhealthy: Sequence[str]) -> None:
    """Atomically replace the resource's health file (what an operator's tool would do)."""
    path = folder / "health" / f"{resource.rpartition('/')[2]}.yaml"
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(f"{i}: Unhealthy\n" for i in unhealthy) or "{}\n")
    os.rename(tmp, path)


def memory_mib(pid: int, field: str = "VmRSS") -> float:
    """A ``kB`` line of /proc/<pid>/status (VmRSS = RssAnon + RssFile + RssShmem), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError(f"no {field} for pid {pid}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of the process so far (/proc/<pid>/stat fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


async def all_listed(kubelet: KubeletStandIn, names: Sequence[str], since: float) -> float:
    """Wait until every resource is registered (after ``since``) and listed; the last listing time."""

    def done() -> bool:
        regs = [kubelet.registration(n) for n in names]
        return all(r is not None and r.listed_at is not None and r.received_at >= since for r in regs)

    await kubelet.wait_until(done, TIMEOUT, "every resource to register")
    return max(kubelet.registration(n).listed_at for n in names)  # type: ignore[union-attr,type-var]


@contextlib.asynccontextmanager
async def daemon(folder: Path, config: Path, kubelet_dir: Path) -> AsyncIterator[subprocess.Popen[bytes]]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    log = (folder / "daemon.log").open("wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cdiplug",
            "serve",
            "--config",
            str(config),
            "--kubelet-dir",
            str(kubelet_dir),
            "--cdi-dir",
            str(folder / "cdi"),
            "--state-dir",
            str(folder / "state"),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.to_thread(proc.wait, 10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()


async def allocate_latency(kubelet: KubeletStandIn, resource: str, ids: Sequence[str], calls: int) -> list[float]:
    times = []
    for n in range(calls):
        started = time.perf_counter()
        await kubelet.allocate(resource, [ids[n % len(ids)]])
        times.append((time.perf_counter() - started) * 1000)
    return times


async def allocate_throughput(kubelet: KubeletStandIn, names: Sequence[str], devices: int, seconds: float) -> float:
    deadline = time.perf_counter() + seconds
    counts = [0] * len(names)

    async def caller(index: int) -> None:
        ids = device_ids(names[index], devices)
        while time.perf_counter() < deadline:
            await kubelet.allocate(names[index], [ids[counts[index] % len(ids)]])
            counts[index] += 1

    started = time.perf_counter()
    await asyncio.gather(*(caller(i) for i in range(len(names))))
    return sum(counts) / (time.perf_counter() - started)


async def health_latency(kubelet: KubeletStandIn, folder: Path, resource: str, devices: int, rounds: int) -> list[float]:
    ids = device_ids(resource, devices)
    times = []
    for n in range(rounds):
        before = kubelet.updates(resource)
        written = time.monotonic()
        write_health(folder, resource, [ids[n % len(ids)]] if n % 2 == 0 else [])
        await kubelet.wait_until(lambda: kubelet.updates(resource) > before, TIMEOUT, "the health change")
        received = [e.at for e in kubelet.events if e.kind == "devices" and e.resource == resource][-1]
        times.append((received - written) * 1000)
    return times


class _NullPlugin(pb_grpc.DevicePluginServicer):
    """Answers Allocate with nothing: measures what the Python caller itself costs."""

    async def GetDevicePluginOptions(self, request, context):
        return pb.DevicePluginOptions()

    async def ListAndWatch(self, request, context):
        yield pb.ListAndWatchResponse(devices=[pb.Device(ID="null-0", health="Healthy")])
        await asyncio.Event().wait()

    async def Allocate(self, request, context):
        return pb.AllocateResponse(container_responses=[pb.ContainerAllocateResponse() for _ in request.container_requests])


async def client_floor(folder: Path, calls: int) -> list[float]:
    kubelet_dir = folder / "floor"
    kubelet_dir.mkdir()
    kubelet = KubeletStandIn(kubelet_dir)
    await kubelet.start()  # first: it cleans the folder, as a kubelet does
    server = grpc.aio.server()
    pb_grpc.add_DevicePluginServicer_to_server(_NullPlugin(), server)
    server.add_insecure_port(f"unix:{kubelet_dir / 'null.sock'}")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"unix:{kubelet_dir / 'kubelet.sock'}") as channel:
            await pb_grpc.RegistrationStub(channel).Register(
                pb.RegisterRequest(version="v1beta1", endpoint="null.sock", resource_name="example.com/null")
            )
        await kubelet.wait_registered("example.com/null")
        return await allocate_latency(kubelet, "example.com/null", ["null-0"], calls)
    finally:
        await kubelet.stop()  # the kubelet goes first, so the plugin sees its stream end cleanly
        await server.stop(None)


async def bench(args: argparse.Namespace) -> dict[str, object]:
    folder = Path(tempfile.mkdtemp(prefix="cdpb-"))
    try:
        (folder / "health").mkdir()
        names = resources(args.resources)
        config = write_config(folder, names, args.devices)
        kubelet_dir = folder / "kubelet"
        figures: dict[str, object] = {"resources": len(names), "devices_per_resource": args.devices}
        async with KubeletStandIn(kubelet_dir) as kubelet:
            spawned = time.monotonic()
            async with daemon(folder, config, kubelet_dir) as proc:
                try:
                    listed = await all_listed(kubelet, names, spawned)
                except TimeoutError as exc:
                    log = (folder / "daemon.log").read_text(errors="replace")[-3000:]
                    raise SystemExit(f"bench: the daemon did not register: {exc}\n--- daemon log ---\n{log}") from None
                figures["start_s"] = round(listed - spawned, 3)
                figures["start_register_sent_s"] = round(
                    max(kubelet.registration(n).received_at for n in names) - spawned,
                    3,  # type: ignore[union-attr]
                )
                await asyncio.sleep(0.5)  # let start-up garbage settle before calling it idle
                figures["rss_mib_idle"] = memory_mib(proc.pid)
                figures["rss_anon_mib_idle"] = memory_mib(proc.pid, "RssAnon")
                figures["rss_file_mib_idle"] = memory_mib(proc.pid, "RssFile")

                rereg = []
                for _ in range(args.restarts):
                    await kubelet.restart(wipe=True)
                    assert kubelet.started_at is not None
                    rereg.append(await all_listed(kubelet, names, kubelet.started_at) - kubelet.started_at)
                figures["reregister_s"] = round(max(rereg), 3)
                figures["reregister_s_each"] = [round(r, 3) for r in rereg]

                ids = device_ids(names[0], args.devices)
                await allocate_latency(kubelet, names[0], ids, 100)  # warm-up
                lat = await allocate_latency(kubelet, names[0], ids, args.calls)
                figures["allocate_ms_p50"] = round(percentile(lat, 50), 3)
                figures["allocate_ms_p99"] = round(percentile(lat, 99), 3)
                cpu_before = cpu_seconds(proc.pid)
                rate = await allocate_throughput(kubelet, names, args.devices, args.seconds)
                figures["allocate_per_s"] = round(rate)
                # Independent of how fast the Python caller is: the daemon's own CPU per call.
                cpu = cpu_seconds(proc.pid) - cpu_before
                figures["daemon_cpu_ms_per_allocate"] = round(cpu * 1000 / (rate * args.seconds), 3)
                figures["daemon_allocate_per_s_per_core"] = round(rate * args.seconds / cpu) if cpu else None

                health = await health_latency(kubelet, folder, names[0], args.devices, args.health_rounds)
                figures["health_update_ms_p50"] = round(statistics.median(health), 1)
                figures["health_update_ms_max"] = round(max(health), 1)
                figures["rss_mib_after_load"] = memory_mib(proc.pid)
            figures["exit_status"] = proc.returncode
        floor = await client_floor(folder, args.calls)
        figures["client_floor_ms_p50"] = round(percentile(floor, 50), 3)
        figures["client_floor_ms_p99"] = round(percentile(floor, 99), 3)
        figures["goals"] = GOALS
        figures["missed"] = missed(figures)
        return figures
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def missed(f: dict[str, object]) -> list[str]:
    checks = {
        "start_s": f["start_s"] <= GOALS["start_s"],  # type: ignore[operator]
        "reregister_s": f["reregister_s"] <= GOALS["reregister_s"],  # type: ignore[operator]
        "allocate_ms_p99": f["allocate_ms_p99"] <= GOALS["allocate_ms_p99"],  # type: ignore[operator]
        "allocate_per_s": f["allocate_per_s"] >= GOALS["allocate_per_s"],  # type: ignore[operator]
        "health_update_ms": f["health_update_ms_max"] <= GOALS["health_update_ms"],  # type: ignore[operator]
        "rss_mib": max(f["rss_mib_idle"], f["rss_mib_after_load"]) <= GOALS["rss_mib"],  # type: ignore[call-overload,operator]
    }
    return [name for name, ok in checks.items() if not ok]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resources", type=int, default=8)
    parser.add_argument("--devices", type=int, default=128)
    parser.add_argument("--calls", type=int, default=2000, help="Allocates for the one-caller latency")
    parser.add_argument("--seconds", type=float, default=3.0, help="how long the 8 callers run")
    parser.add_argument("--restarts", type=int, default=3, help="kubelet restarts to time")
    parser.add_argument("--health-rounds", type=int, default=20)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(bench(args)), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
