#!/usr/bin/env python3
"""Benchmark of a claim's way to a Running pod on the real cluster, cdiplug beside dra-example-driver and a Python floor.

Needs the one-node cluster of ``hack/local-cluster.sh up`` (root) and the Go reference driver
built from its v0.4.0 tag (``$CDIPLUG_PEERS/dra-example-kubeletplugin.xz``, unpacked to a
temporary folder). Both drivers run as host processes on the node, side by side, with the same
kubeconfig, the real kubelet's plugin folders and ``/var/run/cdi``, each kind of claim under a
driver name of its own on each side (cdiplug: one process, a fake resource per kind; the peer:
its gpu profile, a process per kind, as its flags are per process):

- ``plain``: one device;
- ``configured``: one device with an opaque configuration for the driver (cdiplug's
  ``FakeConfig`` with a mode and an env variable; the peer's ``GpuConfig`` with time-slicing);
- ``shared``: 10Gi of a device of 80Gi that allows multiple allocations (KEP-5075; the peer with
  ``--gpu-allow-multiple-allocations``);
- ``partition``: one half of a partitionable device (KEP-4815; the peer with ``--gpu-partitions 2``).

Plain claims have a third side, ``python-floor``: ``bench/floor_dra.py``, the thinnest correct
Python DRA plugin (a process of its own, 4 devices, driver ``plain.floor.bench.example.com``),
so that the plain figures show what a Python driver costs at the least beside what cdiplug costs.

A cdiplug DaemonSet on the node would share the CDI folder with the bench's cdiplug, whose start
removes cdiplug's files that its own state does not know: the bench refuses to run beside one
(``kubectl delete -k deploy/overlays/...`` first).

For ``--pods`` rounds, a pod with a ResourceClaimTemplate of each kind is made for each side
(the order rotating from round to round), and timed from its creation to Ready (``kubectl wait``), then deleted
(waiting until the kubelet has unprepared it). Figures (one JSON object on stdout):

- ``<kind>_pod_ready_s_p50`` / ``_p90``: claim and pod made -> pod Ready, per side, and cdiplug's
  over the peer's (the floor measured in the same run);
- ``<kind>_prepare_ms_mean``: NodePrepareResources as the kubelet times it
  (``dra_grpc_operations_duration_seconds`` of its /metrics, sum over count, per driver): the
  time the driver adds to a pod's start. Goal: cdiplug within 1.3x of the Go driver. The plain
  figures also carry the Python floor's (``python_floor``), ``python_floor_over_go`` and
  ``cdiplug_over_python_floor`` (no goals: they say how much of the gap is Python's own);
- ``<kind>_unprepare_ms_mean``: NodeUnprepareResources the same way. Goal: within 1.3x;
- ``burst_ready_s`` / ``burst_gone_s`` (``--burst`` pods, 50; 0 skips it): that many pods with a
  claim of one device each made at once (one apply) per side, each side in turn on a driver of
  its own with that many devices: made -> every pod Ready, and deleted -> every pod gone and
  every claim unprepared and removed. Two bursts a side, in the order cdiplug, Go, Go, cdiplug
  (one burst's time moves by 10-20% from the next one's on this VM); the mean of the two, each
  in ``bursts_ready_gone_s``. Goal: within 1.1x;
- ``burst_rss_mib``: the driver process's ``VmRSS`` after its last burst (cdiplug's one process;
  the peer's process of the burst driver), and ``burst_rss_growth_mib`` over its RSS before the first.

``--profile`` also samples cdiplug's process and the Python floor's with py-spy while the pods are
made (``bench/spy.py``) and adds ``profile``: each one's sampled time per call (prepares and
unprepares together, the background work of the run included) by owner (the cdiplug module or
floor function a sample was in, with the libraries it called), by piece of work (the task or
worker function) and by library. py-spy's CPU comes from the same cores: a profiled run's
timings are not the figures.

``CDIPLUG_BENCH_KEEP=1`` keeps the temporary folder (the drivers' log, cdiplug's state).

Run: ``sudo python bench/bench_dra_cluster.py [--pods 10] [--kinds plain shared ...] [--table]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import lzma
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import spy

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "hack" / "local-cluster.sh"
PEER_XZ = Path(os.environ.get("CDIPLUG_PEERS", REPO.parent / "shared" / "peers")) / "dra-example-kubeletplugin.xz"
NAMESPACE = "cdiplug-bench"
OURS, PEER, FLOOR = "cdiplug", "dra-example-driver", "python-floor"
PREPARE = "NodePrepareResources"
UNPREPARE = "NodeUnprepareResources"
KINDS = ("plain", "configured", "shared", "partition")
BURST = "burst"  # the burst's driver on each side: plain devices, as many as --burst pods
# The driver each side serves each kind with: cdiplug's fake backend (one process, a resource per
# driver) and the peer's gpu profile (a process per driver: its flags are per process).
DRIVERS = {
    OURS: {
        "plain": "dev.bench.example.com",
        "configured": "conf.bench.example.com",
        "shared": "share.bench.example.com",
        "partition": "part.bench.example.com",
        BURST: "burst.bench.example.com",
    },
    PEER: {
        "plain": "gpu.example.com",
        "configured": "conf.example.com",
        "shared": "share.example.com",
        "partition": "part.example.com",
        BURST: "burst.example.com",
    },
    FLOOR: {"plain": "plain.floor.bench.example.com"},  # bench/floor_dra.py: plain claims only
}
PEER_FLAGS = {
    "plain": [],
    "configured": [],
    "shared": ["--gpu-allow-multiple-allocations"],
    "partition": ["--gpu-partitions", "2"],
    BURST: [],
}
OUR_RESOURCES = [
    {"name": "bench.example.com/dev", "options": {"count": 4}, "dra_driver": DRIVERS[OURS]["plain"]},
    {"name": "bench.example.com/conf", "options": {"count": 4}, "dra_driver": DRIVERS[OURS]["configured"]},
    {
        "name": "bench.example.com/share",
        "options": {
            "count": 2,
            "shared": True,
            "capacity": {"memory": {"value": "80Gi", "default": "1Gi", "min": "1Gi", "step": "1Gi"}},
        },
        "dra_driver": DRIVERS[OURS]["shared"],
    },
    {"name": "bench.example.com/part", "options": {"count": 2, "partitions": [1, 2]}, "dra_driver": DRIVERS[OURS]["partition"]},
]


def driver_of(side: str, kind: str) -> str:
    return DRIVERS[side][kind]


def sides(kind: str) -> tuple[str, ...]:
    """The sides that serve ``kind``: cdiplug, the Go driver and, for plain claims, the Python floor."""
    return tuple(side for side in (OURS, PEER, FLOOR) if kind in DRIVERS[side])


def request(side: str, kind: str) -> dict[str, Any]:
    """One device of the kind: a share asks 10Gi, a partition one half."""
    driver = driver_of(side, kind)
    exactly: dict[str, Any] = {"deviceClassName": f"bench-{driver}"}
    if kind == "shared":
        exactly["capacity"] = {"requests": {"memory": "10Gi"}}
    elif kind == "partition":
        half = f'device.attributes["{driver}"].parts == 2' if side == OURS else f'"partition" in device.attributes["{driver}"]'
        exactly["selectors"] = [{"cel": {"expression": half}}]
    return {"name": "dev", "exactly": exactly}


def config(side: str, kind: str) -> list[dict[str, Any]]:
    """The claim's opaque configuration (configured claims): each driver's own kind of parameters."""
    if kind != "configured":
        return []
    if side == OURS:
        parameters: dict[str, Any] = {
            "apiVersion": "cdiplug.dev/v1alpha1",
            "kind": "FakeConfig",
            "mode": "shared",
            "env": {"LEVEL": "debug"},
        }
    else:
        parameters = {
            "apiVersion": "gpu.resource.example.com/v1alpha1",
            "kind": "GpuConfig",
            "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}},
        }
    return [{"requests": ["dev"], "opaque": {"driver": driver_of(side, kind), "parameters": parameters}}]


def kubectl(kubeconfig: Path, *args: str, input: str | None = None, timeout: float = 120) -> str:
    result = subprocess.run(
        ["kubectl", "--kubeconfig", str(kubeconfig), *args], input=input, capture_output=True, text=True, timeout=timeout
    )
    if result.returncode != 0:
        raise SystemExit(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout


def apply(kubeconfig: Path, *objects: dict[str, Any]) -> None:
    kubectl(
        kubeconfig,
        "apply",
        "--validate=false",
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)}),
    )


def device_class(driver: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": f"bench-{driver}"},
        "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{driver}'"}}]},
    }


def claim_pod(name: str, side: str, kind: str) -> list[dict[str, Any]]:
    devices: dict[str, Any] = {"requests": [request(side, kind)]}
    if config(side, kind):
        devices["config"] = config(side, kind)
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"spec": {"devices": devices}},
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "resourceClaims": [{"name": "dev", "resourceClaimTemplateName": name}],
            "containers": [
                {
                    "name": "main",
                    "image": "busybox:1.36",
                    "command": ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"],
                    "resources": {"claims": [{"name": "dev"}]},
                }
            ],
        },
    }
    return [template, pod]


def kubelet_ops(kubeconfig: Path, node: str, operation: str) -> dict[str, tuple[float, int]]:
    """(sum of seconds, count) of successful ``operation`` calls per driver, from the kubelet's /metrics."""
    text = kubectl(kubeconfig, "get", "--raw", f"/api/v1/nodes/{node}/proxy/metrics")
    out: dict[str, list[float]] = {}
    for line in text.splitlines():
        if (
            not line.startswith("dra_grpc_operations_duration_seconds_")
            or operation
            not in line  # the method's full name holds it (NodePrepareResources is no part of NodeUnprepareResources)
            or 'grpc_status_code="OK"' not in line
        ):
            continue
        sample, value = line.rsplit(" ", 1)
        driver = sample.split('driver_name="', 1)[1].split('"', 1)[0]
        entry = out.setdefault(driver, [0.0, 0.0])
        if sample.startswith("dra_grpc_operations_duration_seconds_sum"):
            entry[0] += float(value)
        elif sample.startswith("dra_grpc_operations_duration_seconds_count"):
            entry[1] += float(value)
    return {d: (s, int(c)) for d, (s, c) in out.items()}


@contextmanager
def drivers(kubeconfig: Path, node: str, folder: Path, burst: int) -> Iterator[dict[str, int]]:
    """cdiplug, the peer and the Python floor running on the node until the block ends; the
    process IDs of cdiplug, of the Python floor and of the peer's burst driver."""
    peer = folder / "dra-example-kubeletplugin"
    peer.write_bytes(lzma.decompress(PEER_XZ.read_bytes()))
    peer.chmod(0o700)
    config = folder / "cdiplug.yaml"
    burst_resource = {"name": "bench.example.com/burst", "options": {"count": max(burst, 1)}, "dra_driver": DRIVERS[OURS][BURST]}
    resources = [{"backend": "fake", "api": "dra", **r} for r in [*OUR_RESOURCES, burst_resource]]
    config.write_text(json.dumps({"resources": resources}))
    common = {"stdout": subprocess.DEVNULL, "stderr": open(folder / "drivers.log", "wb")}  # closed with the processes
    peers = [
        [str(peer), "--node-name", node, "--kubeconfig", str(kubeconfig), "--cdi-root", "/var/run/cdi",
         "--num-devices", {"shared": "2", "partition": "2", BURST: str(max(burst, 1))}.get(kind, "4"),
         "--driver-name", DRIVERS[PEER][kind], *PEER_FLAGS[kind]]
        for kind in DRIVERS[PEER]
    ]  # fmt: skip
    ours = [
        sys.executable, "-m", "cdiplug", "serve", "--config", str(config), "--node-name", node,
        "--kubeconfig", str(kubeconfig), "--state-dir", str(folder / "state"), "--kubelet-dir", str(folder / "dp"),
        "--cdi-dir", "/var/run/cdi", "--plugins-registry-dir", "/var/lib/kubelet/plugins_registry",
        "--plugins-dir", "/var/lib/kubelet/plugins", "--metrics-address", "127.0.0.1:0",
    ]  # fmt: skip
    floor = [
        sys.executable, str(REPO / "bench" / "floor_dra.py"), "--driver-name", DRIVERS[FLOOR]["plain"],
        "--node-name", node, "--kubeconfig", str(kubeconfig), "--cdi-root", "/var/run/cdi",
        "--state-dir", str(folder / "floor-state"), "--num-devices", "4",
        "--plugins-registry-dir", "/var/lib/kubelet/plugins_registry", "--plugins-dir", "/var/lib/kubelet/plugins",
    ]  # fmt: skip
    procs = [subprocess.Popen(args, cwd=REPO, **common) for args in [*peers, floor, ours]]  # type: ignore[call-overload]
    try:
        for driver in [d for side in DRIVERS.values() for d in side.values()]:
            try:
                wait_slice(kubeconfig, driver)
            except SystemExit:
                print((folder / "drivers.log").read_text()[-3000:], file=sys.stderr)
                raise
        yield {OURS: procs[-1].pid, FLOOR: procs[-2].pid, PEER: procs[list(DRIVERS[PEER]).index(BURST)].pid}
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        common["stderr"].close()


# py-spy's samples per second: at 1000 its reads of the processes took more system CPU than both
# drivers, and every call slowed by half
PROFILE_RATE = 200


@contextmanager
def profiled(on: bool, folder: Path, pids: dict[str, int]) -> Iterator[dict[str, Path]]:
    """With ``on``, cdiplug and the Python floor sampled by py-spy until the block ends: each
    side's raw profile; else nothing."""
    with contextlib.ExitStack() as stack:
        yield {
            side: stack.enter_context(spy.record(pids[side], folder / f"{side}.spy", PROFILE_RATE))
            for side in (OURS, FLOOR)
            if on
        }


def profile_figures(raw: dict[str, Path], calls: dict[str, int]) -> dict[str, Any]:
    """Each profiled side's sampled time per call, by owner, piece of work and library (``bench/spy.py``)."""
    own = {OURS: None, FLOOR: "floor_dra"}
    return {side: spy.summarize(path, PROFILE_RATE, calls[side], own_functions=own[side]) for side, path in raw.items()}


def wait_slice(kubeconfig: Path, driver: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:  # a bench, not a test: a plain poll of the slices is fine here
        items = json.loads(kubectl(kubeconfig, "get", "resourceslices", "-o", "json"))["items"]
        if any(s["spec"]["driver"] == driver and s["spec"].get("devices") for s in items):
            return
        time.sleep(0.5)
    raise SystemExit(f"no ResourceSlice of {driver} after {timeout} s")


def one_pod(kubeconfig: Path, name: str, side: str, kind: str) -> float:
    started = time.monotonic()
    apply(kubeconfig, *claim_pod(name, side, kind))
    kubectl(kubeconfig, "wait", "--for=condition=Ready", f"pod/{name}", "-n", NAMESPACE, "--timeout=120s", timeout=130)
    took = time.monotonic() - started
    kubectl(kubeconfig, "delete", "pod", name, "-n", NAMESPACE, "--wait=true", "--timeout=90s", timeout=100)
    kubectl(kubeconfig, "delete", "resourceclaimtemplate", name, "-n", NAMESPACE, "--wait=true", timeout=60)
    return took


def between(before: dict[str, dict[str, tuple[float, int]]], after: dict[str, dict[str, tuple[float, int]]],
            op: str, side: str, kind: str) -> tuple[float, int]:  # fmt: skip
    """Seconds and count of the ``op`` calls the kubelet made to ``side``'s driver of ``kind``
    between two readings of :func:`kubelet_ops` (none when the side does not serve the kind)."""
    if kind not in DRIVERS[side]:
        return 0.0, 0
    s0, c0 = before[op].get(driver_of(side, kind), (0.0, 0))
    s1, c1 = after[op].get(driver_of(side, kind), (0.0, 0))
    return s1 - s0, c1 - c0


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def claims_left(kubeconfig: Path, prefix: str) -> int:
    items = json.loads(kubectl(kubeconfig, "get", "resourceclaims", "-n", NAMESPACE, "-o", "json"))["items"]
    return sum(c["metadata"]["name"].startswith(prefix) for c in items)


def one_burst(kubeconfig: Path, side: str, pods: int, pid: int) -> dict[str, float]:
    """``pods`` pods with a claim each, made at once: seconds to all Ready, and from the delete
    to all gone with their claims unprepared and removed; the driver's RSS before and after (MiB)."""
    rss_before = rss_mib(pid)
    objects = [o for i in range(pods) for o in claim_pod(f"burst-{side}-{i}", side, BURST)]
    for o in objects:
        o["metadata"]["labels"] = {"cdiplug-bench-burst": side}
    started = time.monotonic()
    apply(kubeconfig, *objects)
    kubectl(kubeconfig, "wait", "--for=condition=Ready", "pod", "-l", f"cdiplug-bench-burst={side}", "-n", NAMESPACE,
            "--timeout=300s", timeout=310)  # fmt: skip
    ready = time.monotonic() - started
    started = time.monotonic()
    kubectl(kubeconfig, "delete", "pod", "-l", f"cdiplug-bench-burst={side}", "-n", NAMESPACE, "--wait=true",
            "--timeout=300s", timeout=310)  # fmt: skip
    deadline = time.monotonic() + 120
    while claims_left(kubeconfig, f"burst-{side}-") and time.monotonic() < deadline:  # a bench: a plain poll is fine
        time.sleep(0.1)
    gone = time.monotonic() - started
    kubectl(kubeconfig, "delete", "resourceclaimtemplate", "-l", f"cdiplug-bench-burst={side}", "-n", NAMESPACE, "--wait=true")
    return {"ready": ready, "gone": gone, "rss_before": rss_before, "rss": rss_mib(pid)}


def two_bursts_each(kubeconfig: Path, pods: int, pids: dict[str, int]) -> dict[str, dict[str, Any]]:
    """Each side's burst twice, in the order cdiplug, Go, Go, cdiplug (neither side always first,
    and a mean of two where one burst moves by 10-20%): the times are the means of the two, the RSS
    after the last one and its growth over the RSS before the first."""
    runs: dict[str, list[dict[str, float]]] = {OURS: [], PEER: []}
    for side in (OURS, PEER, PEER, OURS):
        runs[side].append(one_burst(kubeconfig, side, pods, pids[side]))
    return {
        side: {
            "ready": statistics.mean(r["ready"] for r in two),
            "gone": statistics.mean(r["gone"] for r in two),
            "rss": two[-1]["rss"],
            "rss_growth": two[-1]["rss"] - two[0]["rss_before"],
            "each": [(round(r["ready"], 3), round(r["gone"], 3)) for r in two],
        }
        for side, two in runs.items()
    }


def figure(ours: float, peer: float, goal: float | None) -> dict[str, Any]:
    ratio = ours / peer if peer else float("inf")
    return {
        "cdiplug": round(ours, 4),
        "floor": round(peer, 4),
        "ratio": round(ratio, 3),
        "goal": f"<= {goal}x the Go driver" if goal else None,
        "met": (ratio <= goal) if goal else None,
    }


def with_python_floor(fig: dict[str, Any], value: float) -> None:
    """The Python floor's value beside a figure (``floor`` stays the Go driver's) and its two ratios."""
    fig["python_floor"] = round(value, 4)
    fig["python_floor_over_go"] = round(value / fig["floor"], 3) if fig["floor"] else float("inf")
    fig["cdiplug_over_python_floor"] = round(fig["cdiplug"] / value, 3) if value else float("inf")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=10, help="pods per kind and driver (default 10)")
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS), help="claims to time (default: all)")
    parser.add_argument("--burst", type=int, default=50, help="pods made at once per side in the burst (default 50; 0: none)")
    parser.add_argument("--table", action="store_true", help="a human table on stderr too")
    parser.add_argument("--profile", action="store_true", help="sample cdiplug and the Python floor with py-spy (bench/spy.py)")
    args = parser.parse_args()
    env = dict(
        line.removeprefix("export ").split("=", 1)
        for line in subprocess.run([str(SCRIPT), "env"], capture_output=True, text=True, check=True).stdout.splitlines()
        if "=" in line
    )
    kubeconfig = Path(env["KUBECONFIG"])
    (node,) = [n["metadata"]["name"] for n in json.loads(kubectl(kubeconfig, "get", "nodes", "-o", "json"))["items"]]
    if kubectl(kubeconfig, "get", "daemonsets", "-A", "-l", "app.kubernetes.io/name=cdiplug", "-o", "name").strip():
        raise SystemExit("a cdiplug DaemonSet runs on the cluster: delete it first (see the docstring)")
    folder = Path(tempfile.mkdtemp(prefix="cdiplug-bench-"))
    profile: dict[str, Any] = {}
    times: dict[tuple[str, str], list[float]] = {(side, kind): [] for kind in args.kinds for side in sides(kind)}
    classes = [device_class(d) for side in DRIVERS.values() for d in side.values()]
    try:
        kubectl(kubeconfig, "create", "namespace", NAMESPACE)
        apply(kubeconfig, *classes)
        with drivers(kubeconfig, node, folder, args.burst) as pids:
            for kind in args.kinds:  # first pods: image and caches warm for every side
                for side in sides(kind):
                    one_pod(kubeconfig, f"warm-{side}-{kind}", side, kind)
            before = {op: kubelet_ops(kubeconfig, node, op) for op in (PREPARE, UNPREPARE)}
            with profiled(args.profile, folder, pids) as raw:
                for i in range(args.pods):
                    for kind in args.kinds:
                        order = sides(kind)
                        for side in order[i % len(order) :] + order[: i % len(order)]:  # each side first in turn
                            times[(side, kind)].append(one_pod(kubeconfig, f"p{i}-{side}-{kind}", side, kind))
            after = {op: kubelet_ops(kubeconfig, node, op) for op in (PREPARE, UNPREPARE)}
            if raw:
                calls = {
                    side: sum(between(before, after, op, side, kind)[1] for op in (PREPARE, UNPREPARE) for kind in args.kinds)
                    for side in raw
                }
                profile = profile_figures(raw, calls)
            bursts = two_bursts_each(kubeconfig, args.burst, pids) if args.burst else {}
    finally:
        kubectl(kubeconfig, "delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true", timeout=150)
        kubectl(kubeconfig, "delete", "deviceclass", *(c["metadata"]["name"] for c in classes), "--ignore-not-found")
        if not os.environ.get("CDIPLUG_BENCH_KEEP"):
            shutil.rmtree(folder, ignore_errors=True)
        else:
            print(f"kept {folder}", file=sys.stderr)

    def mean_ms(op: str, side: str, kind: str) -> float:
        seconds, count = between(before, after, op, side, kind)
        return 1000 * seconds / max(1, count)

    def q90(values: list[float]) -> float:
        return statistics.quantiles(values, n=10)[8] if len(values) >= 2 else values[0]

    figures: dict[str, dict[str, Any]] = {}
    for kind in args.kinds:
        ours, peer = times[(OURS, kind)], times[(PEER, kind)]
        figures[f"{kind}_pod_ready_s_p50"] = figure(statistics.median(ours), statistics.median(peer), None)
        figures[f"{kind}_pod_ready_s_p90"] = figure(q90(ours), q90(peer), None)
        figures[f"{kind}_prepare_ms_mean"] = figure(mean_ms(PREPARE, OURS, kind), mean_ms(PREPARE, PEER, kind), 1.3)
        figures[f"{kind}_unprepare_ms_mean"] = figure(mean_ms(UNPREPARE, OURS, kind), mean_ms(UNPREPARE, PEER, kind), 1.3)
        if FLOOR in sides(kind):
            floor = times[(FLOOR, kind)]
            with_python_floor(figures[f"{kind}_pod_ready_s_p50"], statistics.median(floor))
            with_python_floor(figures[f"{kind}_pod_ready_s_p90"], q90(floor))
            with_python_floor(figures[f"{kind}_prepare_ms_mean"], mean_ms(PREPARE, FLOOR, kind))
            with_python_floor(figures[f"{kind}_unprepare_ms_mean"], mean_ms(UNPREPARE, FLOOR, kind))
    if bursts:
        figures["burst_ready_s"] = figure(bursts[OURS]["ready"], bursts[PEER]["ready"], 1.1)
        figures["burst_gone_s"] = figure(bursts[OURS]["gone"], bursts[PEER]["gone"], 1.1)
        figures["burst_rss_mib"] = figure(bursts[OURS]["rss"], bursts[PEER]["rss"], None)
        figures["burst_rss_growth_mib"] = figure(bursts[OURS]["rss_growth"], bursts[PEER]["rss_growth"], None)
    out = {
        "pods_per_kind": args.pods,
        "burst_pods": args.burst,
        "figures": figures,
        "missed": [k for k, f in figures.items() if f["met"] is False],
    }
    if bursts:
        out["bursts_ready_gone_s"] = {side: b["each"] for side, b in bursts.items()}  # in the order made
    if profile:
        out["profile"] = profile
    print(json.dumps(out, indent=1))
    if args.table:
        for name, f in figures.items():
            line = f"{name:30} cdiplug {f['cdiplug']:>9} dra-example-driver {f['floor']:>9} ratio {f['ratio']}"
            if "python_floor" in f:
                line += f"  python-floor {f['python_floor']:>9} (/go {f['python_floor_over_go']}, cdiplug/it {f['cdiplug_over_python_floor']})"
            print(line, file=sys.stderr)
        for side, each in out.get("bursts_ready_gone_s", {}).items():
            print(f"{side} bursts (ready, gone) s: {each}", file=sys.stderr)
        for side, summary in profile.items():
            print(f"{side}: {summary['ms_per_call']} ms sampled per call ({summary['calls']} calls)", file=sys.stderr)
            for view in ("by_owner_ms", "by_work_ms"):
                for name, ms in summary[view].items():
                    print(f"  {view[3:-3]:5} {name:60} {ms:8.3f} ms", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
