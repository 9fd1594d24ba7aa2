"""What the bench scripts share: spawning a plugin process, reading its memory and CPU, driving it
through the kubelet stand-in, and shaping figures with their floor, ratio and goal.

Both plugins, cdiplug (``python -m cdiplug serve`` with documented flags only) and the floor
(``bench/floor_plugin.py``), are measured by the same functions here, against a fresh
``cdiplug.testing.KubeletStandIn`` each, over real unix sockets. Only ``cdiplug.testing`` and
``cdiplug.api`` are imported from the project, so the bench survives moves inside the core.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from cdiplug.testing import KubeletStandIn

BENCH = Path(__file__).resolve().parent
TIMEOUT = 60.0
SETTLE_S = 0.5  # after start, before a process is called idle


# --- names, configuration, health files ------------------------------------------------------


def resources(count: int) -> list[str]:
    return [f"example.com/bench{i}" for i in range(count)]


def device_ids(resource: str, devices: int) -> list[str]:
    cls = resource.rpartition("/")[2]
    return [f"{cls}-{i}" for i in range(devices)]


def health_path(folder: Path, resource: str) -> Path:
    return folder / "health" / f"{resource.rpartition('/')[2]}.yaml"


def write_config(folder: Path, names: Sequence[str], devices: int, numa_nodes: int) -> Path:
    """A cdiplug configuration: each name a fake resource of ``devices`` devices over NUMA nodes
    0..numa_nodes-1, with a health file. Written as the Helm chart writes it: JSON in
    ``config.yaml`` (a YAML configuration costs the daemon PyYAML's import, see README)."""
    (folder / "health").mkdir(exist_ok=True)
    resources = [
        {
            "name": name,
            "backend": "fake",
            "options": {"count": devices, "numa_nodes": list(range(numa_nodes)), "health_file": str(health_path(folder, name))},
        }
        for name in names
    ]
    path = folder / "config.yaml"
    path.write_text(json.dumps({"resources": resources}, indent=2) + "\n")
    return path


def write_health(folder: Path, resource: str, unhealthy: Sequence[str]) -> float:
    """Atomically replace the resource's health file (what an operator's tool would do); the
    monotonic time of the rename."""
    path = health_path(folder, resource)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(f"{i}: Unhealthy\n" for i in unhealthy) or "{}\n")
    at = time.monotonic()
    os.rename(tmp, path)
    return at


# --- process figures -------------------------------------------------------------------------


def memory_mib(pid: int, field: str = "VmRSS") -> float:
    """A ``kB`` line of /proc/<pid>/status (VmRSS = RssAnon + RssFile + RssShmem), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return round(int(line.split()[1]) / 1024, 2)
    raise RuntimeError(f"no {field} for pid {pid}")


def rss(pid: int) -> dict[str, float]:
    return {"rss": memory_mib(pid), "anon": memory_mib(pid, "RssAnon"), "file": memory_mib(pid, "RssFile")}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of the process so far (/proc/<pid>/stat fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


# --- the two plugins -------------------------------------------------------------------------


def cdiplug_argv(folder: Path, config: Path, kubelet_dir: Path) -> list[str]:
    return [
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
    ]


def floor_argv(kubelet_dir: Path, count: int, devices: int, numa_nodes: int) -> list[str]:
    return [
        sys.executable,
        str(BENCH / "floor_plugin.py"),
        "--kubelet-dir",
        str(kubelet_dir),
        "--resources",
        str(count),
        "--devices",
        str(devices),
        "--numa-nodes",
        str(numa_nodes),
    ]


# Where the plugins' bytecode goes (None: as the environment says). A deployed image has its .pyc
# files; an environment with PYTHONDONTWRITEBYTECODE=1 would make every start compile cdiplug
# from source, a cost the floor (one small file) hardly pays. See use_bytecode_cache.
_PYCACHE: Path | None = None


def use_bytecode_cache(folder: Path | None) -> None:
    """Let the plugin processes write and read bytecode under ``folder`` (PYTHONPYCACHEPREFIX),
    whatever PYTHONDONTWRITEBYTECODE says; None: leave the environment as it is."""
    global _PYCACHE
    _PYCACHE = folder


def plugin_env() -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if _PYCACHE is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(_PYCACHE)
    return env


class PluginExited(Exception):
    """The plugin process ended before it registered."""


class Plugin:
    """A plugin process under measurement, with its stand-in and its start-up times."""

    def __init__(self, name: str, proc: subprocess.Popen[bytes], kubelet: KubeletStandIn, log: Path) -> None:
        self.name = name
        self.proc = proc
        self.kubelet = kubelet
        self.log = log
        self.exec_at = 0.0
        self.registered_s = 0.0  # exec -> last Register received by the stand-in
        self.listed_s = 0.0  # exec -> every resource's first ListAndWatch list received
        self.exit_status: int | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""


@contextlib.asynccontextmanager
async def running(name: str, argv: list[str], kubelet_dir: Path, names: Sequence[str], log: Path) -> AsyncIterator[Plugin]:
    """Serve a fresh stand-in on ``kubelet_dir``, exec ``argv`` and wait until every resource of
    ``names`` is registered and listed; stop the process with SIGTERM on the way out."""
    async with KubeletStandIn(kubelet_dir, call_timeout=60) as kubelet:
        env = plugin_env()
        with log.open("wb") as out:
            exec_at = time.monotonic()
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        plugin = Plugin(name, proc, kubelet, log)
        plugin.exec_at = exec_at
        try:
            try:
                await all_listed(kubelet, names, exec_at, proc)
            except (TimeoutError, PluginExited) as exc:
                raise SystemExit(f"bench: {name} did not register: {exc}\n--- {name} log ---\n{plugin.log_tail()}") from None
            regs = [kubelet.registration(n) for n in names]
            plugin.registered_s = max(r.received_at for r in regs) - exec_at  # type: ignore[union-attr]
            plugin.listed_s = max(r.listed_at for r in regs) - exec_at  # type: ignore[union-attr,type-var]
            yield plugin
        finally:
            await kubelet.stop()  # the kubelet goes first, so the plugin sees its streams end
            plugin.exit_status = await stop_process(proc)


async def stop_process(proc: subprocess.Popen[bytes]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(proc.wait, 10)
        except subprocess.TimeoutExpired:
            proc.kill()
            await asyncio.to_thread(proc.wait)
    return proc.returncode


async def all_listed(
    kubelet: KubeletStandIn, names: Sequence[str], since: float, proc: subprocess.Popen[bytes] | None = None
) -> float:
    """Wait until every resource is registered (after ``since``) and listed; the last listing time."""

    def done() -> bool:
        if proc is not None and proc.poll() is not None:
            raise PluginExited(f"the process exited with status {proc.returncode} before registering")
        regs = [kubelet.registration(n) for n in names]
        return all(r is not None and r.listed_at is not None and r.received_at >= since for r in regs)

    # wake now and then as well, to notice a process that died without registering
    deadline = time.monotonic() + TIMEOUT
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up after {TIMEOUT} s: {kubelet.describe()}")
        with contextlib.suppress(TimeoutError):
            await kubelet.wait_until(done, 0.5, "every resource to register")
    return max(kubelet.registration(n).listed_at for n in names)  # type: ignore[union-attr,type-var]


# --- load --------------------------------------------------------------------------------------


async def allocate_latency(kubelet: KubeletStandIn, resource: str, ids: Sequence[str], calls: int) -> list[float]:
    """Sequential Allocate calls of one device each; round trips in ms."""
    times = []
    for n in range(calls):
        started = time.perf_counter()
        await kubelet.allocate(resource, [ids[n % len(ids)]])
        times.append((time.perf_counter() - started) * 1000)
    return times


async def allocate_callers(
    kubelet: KubeletStandIn, names: Sequence[str], devices: int, *, seconds: float | None = None, total: int | None = None
) -> tuple[int, float]:
    """One caller per resource, each sending the next Allocate as soon as the last returns, for
    ``seconds`` or until ``total`` calls in all; (calls, elapsed seconds)."""
    deadline = time.perf_counter() + seconds if seconds is not None else float("inf")
    budget = [total if total is not None else -1]
    counts = [0] * len(names)

    async def caller(index: int) -> None:
        ids = device_ids(names[index], devices)
        while time.perf_counter() < deadline and budget[0] != 0:
            budget[0] -= 1
            await kubelet.allocate(names[index], [ids[counts[index] % len(ids)]])
            counts[index] += 1

    started = time.perf_counter()
    await asyncio.gather(*(caller(i) for i in range(len(names))))
    return sum(counts), time.perf_counter() - started


async def allocate_random_sets(
    kubelet: KubeletStandIn, names: Sequence[str], devices: int, *, callers: int, total: int, seed: int, most: int = 8
) -> int:
    """``callers`` concurrent callers, each Allocating a random set of 1 to ``most`` devices of a
    random resource, ``total`` calls in all (reproducible from ``seed``); the calls made."""
    rng = random.Random(seed)
    ids = {name: device_ids(name, devices) for name in names}
    budget = [total]

    async def caller() -> None:
        while budget[0] > 0:
            budget[0] -= 1
            name = rng.choice(names)
            await kubelet.allocate(name, rng.sample(ids[name], rng.randint(1, min(most, devices))))

    await asyncio.gather(*(caller() for _ in range(callers)))
    return total


async def preferred_latency(
    kubelet: KubeletStandIn, resource: str, available: Sequence[str], must_include: Sequence[str], size: int, calls: int
) -> list[float]:
    """Sequential GetPreferredAllocation calls (one container request); round trips in ms."""
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        answer = await kubelet.preferred_allocation(resource, available, must_include, size)
        times.append((time.perf_counter() - started) * 1000)
        if len(answer) != size or not set(must_include) <= set(answer):
            raise SystemExit(f"bench: preferred allocation answered {answer} for size {size}, must include {must_include}")
    return times


async def settle(pid: int, quiet_s: float = 0.05, limit_s: float = 10.0) -> None:
    """Wait until the process used no CPU for ``quiet_s`` (it finished what the last change started)."""
    deadline = time.monotonic() + limit_s
    before = cpu_seconds(pid)
    while time.monotonic() < deadline:
        await asyncio.sleep(quiet_s)
        now = cpu_seconds(pid)
        if now == before:
            return
        before = now


async def health_latency(
    kubelet: KubeletStandIn, folder: Path, resource: str, devices: int, rounds: int, settle_pid: int | None = None
) -> list[float]:
    """Flip one device's health per round (even rounds: one device Unhealthy; odd: all Healthy),
    the health file replaced by rename; ms from the rename to the stand-in receiving the first
    ListAndWatch list showing the change.

    With ``settle_pid``, each flip waits until that process is idle (an isolated change);
    without, the next flip follows as soon as the last one arrived (a burst: what the plugin
    still does after publishing, such as rewriting its CDI spec, delays the next)."""
    ids = device_ids(resource, devices)
    times = []
    for n in range(rounds):
        if settle_pid is not None:
            await settle(settle_pid)
        unhealthy = [ids[(n // 2 * 7919) % len(ids)]] if n % 2 == 0 else []
        want = f"{devices} devices, {devices - len(unhealthy)} healthy"
        written = write_health(folder, resource, unhealthy)

        def arrived() -> float | None:
            first = None
            for event in reversed(kubelet.events):  # newest first, back to the write
                if event.at < written:
                    break
                if event.kind == "devices" and event.resource == resource and event.detail == want:
                    first = event.at
            return first

        received = await kubelet.wait_until(arrived, TIMEOUT, f"the health change of round {n}")
        times.append((received - written) * 1000)
    return times


# --- figures -----------------------------------------------------------------------------------


def figure(
    cdiplug: float | None,
    floor: float | None = None,
    *,
    goal: str | None = None,
    met: bool | None = None,
    digits: int = 3,
    **extra: Any,
) -> dict[str, Any]:
    """One figure: cdiplug's value, the floor's and their ratio (when measured), the goal and
    whether it is met (None: no goal)."""

    def rounded(value: float) -> float:
        # ``digits`` decimals, but never fewer than three significant digits: a small floor
        # rounded to one digit would make the printed ratio disagree with the printed values.
        places = digits if value == 0 else max(digits, 2 - math.floor(math.log10(abs(value))))
        return round(value) if places == 0 else round(value, places)

    out: dict[str, Any] = {"cdiplug": None if cdiplug is None else rounded(cdiplug)}
    if floor is not None:
        out["floor"] = rounded(floor)
        out["ratio"] = round(cdiplug / floor, 3) if cdiplug is not None and floor else None
    out.update(extra)
    out["goal"] = goal
    out["met"] = met
    return out


def ratio_at_most(cdiplug: float, floor: float, limit: float, **extra: Any) -> dict[str, Any]:
    return figure(cdiplug, floor, goal=f"<= {limit}x floor", met=cdiplug <= limit * floor, **extra)


def ratio_at_least(cdiplug: float, floor: float, limit: float, **extra: Any) -> dict[str, Any]:
    return figure(cdiplug, floor, goal=f">= {limit}x floor", met=cdiplug >= limit * floor, **extra)


def floor_plus(cdiplug: float, floor: float, mib: float | None, **extra: Any) -> dict[str, Any]:
    if mib is None:
        return figure(cdiplug, floor, digits=1, over_floor=round(cdiplug - floor, 1), **extra)
    return figure(
        cdiplug,
        floor,
        goal=f"<= floor + {mib} MiB",
        met=cdiplug <= floor + mib,
        digits=1,
        over_floor=round(cdiplug - floor, 1),
        **extra,
    )


def at_most(cdiplug: float, limit: float | None, unit: str, floor: float | None = None, **extra: Any) -> dict[str, Any]:
    if limit is None:
        return figure(cdiplug, floor, **extra)
    return figure(cdiplug, floor, goal=f"<= {limit} {unit}", met=cdiplug <= limit, **extra)


def missed(figures: dict[str, Any], prefix: str = "") -> list[str]:
    """Names of the figures (nested dicts walked) whose goal is not met."""
    out = []
    for name, value in figures.items():
        if isinstance(value, dict):
            if "met" in value:
                if value["met"] is False:
                    out.append(prefix + name)
            else:
                out += missed(value, f"{prefix}{name}.")
    return out


def table(figures: dict[str, Any], prefix: str = "") -> list[str]:
    """A human table of the figures (for stderr)."""
    rows = []
    for name, value in figures.items():
        if isinstance(value, dict) and "met" in value:
            mark = {True: "ok", False: "MISSED", None: ""}[value["met"]]
            floor = value.get("floor", "")
            ratio = value.get("ratio", "")
            rows.append(
                f"{prefix + name:<44} {value['cdiplug']!s:>10} {floor!s:>10} {ratio!s:>7}  {value['goal'] or '':<22} {mark}"
            )
        elif isinstance(value, dict):
            rows += table(value, f"{prefix}{name}.")
    return rows


def emit(result: dict[str, Any], figures: dict[str, Any], *, show_table: bool, started: float) -> int:
    """Print ``result`` as one JSON object on stdout, with ``bench_s`` since ``started``; with
    ``show_table``, ``figures`` as the human table on stderr. The exit status of a bench: 0."""
    result["bench_s"] = round(time.monotonic() - started, 1)
    print(json.dumps(result, indent=2))
    if show_table:
        print("\n".join([table_header(), *table(figures)]), file=sys.stderr)
    return 0


def table_header() -> str:
    return f"{'figure':<44} {'cdiplug':>10} {'floor':>10} {'ratio':>7}  {'goal':<22} met"


def stand_in_list_ms(devices: int, numa_nodes: int, runs: int = 7) -> float:
    """What the stand-in itself spends on one ListAndWatch list of ``devices`` devices (parse the
    message and keep it as the kubelet does), median ms: part of every health figure, a cost the
    real kubelet (Go) has far less of."""
    from cdiplug.api import deviceplugin_v1beta1_pb2 as pb

    try:
        from cdiplug.testing.kubelet_plugin import listed_devices
    except ImportError:  # moved: time the parse alone

        def listed_devices(response: Any) -> Any:
            return response

    message = pb.ListAndWatchResponse()
    for j in range(devices):
        device = message.devices.add(ID=f"bench0-{j}", health="Healthy")
        if numa_nodes:
            device.topology.nodes.add(ID=j % numa_nodes)
    data = message.SerializeToString()
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        listed_devices(pb.ListAndWatchResponse.FromString(data))
        times.append((time.perf_counter() - started) * 1000)
    return percentile(times, 50)
