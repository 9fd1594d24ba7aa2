"""The bench scripts still run and report every figure (a smoke test, not a timing test).

Speed and memory goals are judged by reading the printed figures, never here; this only keeps
the scripts from rotting as the code under them changes. Each runs as a subprocess with small
knobs, against the real daemon and the floor plugin (bench_daemon, bench_scale, bench_breakdown) and a built sysfs
tree (bench_pci_scan). Figures must be present and well-formed (a number, the floor's number and
their ratio where the floor is measured, a goal and whether it is met); their values are not judged.
"""

from __future__ import annotations

import asyncio
import json
import math
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from cdiplug.testing import ApiServerStandIn, DraKubeletStandIn
from cdiplug.testing.dra_kubelet import ClaimRef

pytestmark = pytest.mark.slow  # runs the bench scripts: tens of seconds (hack/test.sh --fast leaves it out)

ROOT = Path(__file__).resolve().parents[2]


def run_bench(script: str, *args: str) -> dict:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *args], capture_output=True, text=True, timeout=240, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_figure(name: str, fig: dict, *, floor: bool) -> None:
    """One figure: cdiplug's value; with ``floor``, the floor's and a ratio that is their quotient;
    a goal (text or None) and ``met`` (bool, or None exactly when there is no goal)."""
    assert is_number(fig["cdiplug"]), (name, fig)
    if floor:
        assert is_number(fig["floor"]) and fig["floor"] > 0, (name, fig)
        assert is_number(fig["ratio"]), (name, fig)
        assert math.isclose(fig["ratio"], fig["cdiplug"] / fig["floor"], rel_tol=0.02, abs_tol=0.002), (name, fig)
    assert fig["goal"] is None or isinstance(fig["goal"], str), (name, fig)
    assert (fig["met"] is None) == (fig["goal"] is None), (name, fig)
    assert fig["met"] is None or isinstance(fig["met"], bool), (name, fig)


def not_met(figures: dict, prefix: str = "") -> list[str]:
    """The figures whose goal is not met, nested dicts walked (``"4096.rss_idle_mib"``)."""
    out = []
    for name, value in figures.items():
        if "met" in value:
            out += [prefix + name] if value["met"] is False else []
        else:
            out += not_met(value, f"{prefix}{name}.")
    return out


def check_missed(figures: dict, missed: list[str]) -> None:
    """``missed`` names exactly the figures whose goal is not met."""
    assert sorted(missed) == sorted(not_met(figures))


WITH_FLOOR = ("start_registered_s", "start_listed_s", "rss_idle_mib", "rss_anon_idle_mib", "allocate_p50_ms")


def test_bench_daemon_reports_every_figure_beside_the_floor() -> None:
    result = run_bench(
        "bench_daemon.py",
        "--resources",
        "2",
        "--devices",
        "8",
        "--starts",
        "1",
        "--calls",
        "50",
        "--seconds",
        "0.5",
        "--mem-allocates",
        "100",
        "--load-callers",
        "4",
        "--load-allocates",
        "40",
        "--health-rounds",
        "2",
        "--health-changes",
        "4",
        "--restarts",
        "1",
    )
    figures = result["figures"]
    for name in (
        *WITH_FLOOR,
        "rss_file_idle_mib",
        "allocate_p99_ms",
        "allocate_per_s",
        "cpu_ms_per_allocate",
        "rss_after_load_mib",
    ):
        check_figure(name, figures[name], floor=True)
    for name in (
        "rss_growth_after_allocates_mib",
        "rss_growth_after_health_changes_mib",
        "rss_after_random_sets_mib",
        "health_update_ms_p50",
        "health_update_ms_max",
        "health_burst_ms_p50",
        "health_burst_ms_max",
        "reregister_s",
        "exit_status",
    ):
        check_figure(name, figures[name], floor=False)
    for name in (
        "start_registered_s",
        "rss_idle_mib",
        "allocate_p50_ms",
        "allocate_per_s",
        "health_update_ms_p50",
        "rss_growth_after_allocates_mib",
        "rss_growth_after_health_changes_mib",
        "rss_after_random_sets_mib",
    ):
        assert figures[name]["goal"], name  # the goals are stated beside the figures
    rss = figures["rss_idle_mib"]
    assert math.isclose(rss["over_floor"], rss["cdiplug"] - rss["floor"], abs_tol=0.11)  # each rounded to 0.1
    assert figures["rss_growth_after_allocates_mib"]["allocates"] == 100
    # Memory after a load: three rounds of random sets, RSS after each (cdiplug's and the floor's);
    # the figure is the third minus the second.
    flat = figures["rss_after_random_sets_mib"]
    assert len(flat["rounds"]) == len(flat["floor_rounds"]) == 3 and all(map(is_number, flat["rounds"] + flat["floor_rounds"]))
    assert math.isclose(flat["cdiplug"], flat["rounds"][2] - flat["rounds"][1], abs_tol=0.11)
    assert (flat["callers"], flat["allocates_per_round"]) == (4, 40)
    assert is_number(figures["rss_growth_after_allocates_mib"]["floor_growth"])
    assert figures["rss_growth_after_health_changes_mib"]["health_changes"] == 4
    assert figures["health_update_ms_p50"]["changes"] == 2 and figures["health_burst_ms_p50"]["changes"] == 4
    assert is_number(figures["health_update_ms_p50"]["stand_in_ms"])
    assert result["bytecode_cache"] is True
    assert figures["exit_status"]["cdiplug"] == 0 and figures["exit_status"]["floor_exit_status"] == 0
    assert len(figures["start_registered_s"]["each"]["floor"]) == 1
    check_missed(figures, result["missed"])


def test_bench_scale_reports_every_size() -> None:
    result = run_bench("bench_scale.py", "--sizes", "8,16", "--calls", "20", "--preferred-calls", "3", "--health-changes", "2")
    assert sorted(result["sizes"]) == ["16", "8"]
    for size, figures in result["sizes"].items():
        for name in (*WITH_FLOOR, "rss_after_load_mib", "preferred_p50_ms", "preferred_must_include_p50_ms"):
            check_figure(f"{size}.{name}", figures[name], floor=True)
        for name in ("health_update_ms_p50", "health_update_ms_max", "health_burst_ms_p50", "health_burst_ms_max", "exit_status"):
            check_figure(f"{size}.{name}", figures[name], floor=False)
        assert figures["health_update_ms_p50"]["goal"] == "<= 10.0 ms"  # 128 devices or fewer
        assert figures["preferred_must_include_p50_ms"]["goal"] == "<= 10.0 ms"
        assert figures["exit_status"]["cdiplug"] == 0
    check_missed(result["sizes"], result["missed"])


def test_bench_breakdown_splits_the_start_gap_into_its_parts() -> None:
    result = run_bench("bench_breakdown.py", "--starts", "1", "--runs", "1")
    figures = result["figures"]
    check_figure("start_registered_s", figures["start_registered_s"], floor=True)
    assert figures["start_registered_s"]["goal"] == "<= 1.7x floor"
    for name, fig in figures.items():
        if name != "start_registered_s":
            check_figure(name, fig, floor=False)
    assert figures["imports_required_libraries_ms"]["libraries"] == ["attrs", "cattrs"]  # the configuration is JSON: no PyYAML
    parts = ("imports_required_libraries_ms", "imports_cdiplug_own_ms", "start_work_ms")
    assert math.isclose(sum(figures[p]["cdiplug"] for p in parts), figures["start_gap_ms"]["cdiplug"], abs_tol=0.2)
    start = figures["start_registered_s"]
    bound = 1 + figures["imports_required_libraries_ms"]["cdiplug"] / 1000 / start["floor"]
    assert math.isclose(figures["start_ratio_with_libraries_alone"]["cdiplug"], bound, abs_tol=0.01)
    check_missed(figures, result["missed"])


@pytest.mark.parametrize(
    ("script", "stubs"),
    [
        ("floor_plugin.py", ("deviceplugin_v1beta1_pb2", "deviceplugin_v1beta1_pb2_grpc")),
        ("floor_dra.py", ("dra_v1_pb2", "dra_v1_pb2_grpc", "pluginregistration_v1_pb2", "pluginregistration_v1_pb2_grpc")),
    ],
)
def test_a_floor_imports_nothing_of_cdiplug_but_its_stubs(script: str, stubs: tuple[str, ...]) -> None:
    """A floor stays thin: loading it must not run cdiplug's package __init__ files."""
    code = textwrap.dedent(
        f"""
        import json, runpy, sys
        runpy.run_path({str(ROOT / "bench" / script)!r}, run_name="floor")
        print(json.dumps(sorted(m for m in sys.modules if m.startswith(("cdiplug", "_floor_stubs")))))
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert loaded == sorted(["_floor_stubs", *(f"_floor_stubs.{s}" for s in stubs)])


async def test_floor_dra_publishes_prepares_unprepares_and_cleans_up(short_tmp: Path) -> None:
    """floor_dra.py against the API-server and kubelet stand-ins: the slice, a claim prepared (its
    CDI spec and checkpoint written) and unprepared, and on SIGTERM the slice gone and exit 0."""
    tmp_path = short_tmp  # its sockets' paths must fit a unix socket address

    driver, node, uid = "floor.example.com", "node-a", "0a1b2c3d-0000-4000-8000-000000000001"
    cdi, state, registry = tmp_path / "cdi", tmp_path / "state", tmp_path / "registry"
    cdi.mkdir()
    async with ApiServerStandIn() as api, DraKubeletStandIn(registry, timeout=20) as kubelet:
        result = {"request": "dev", "driver": driver, "pool": node, "device": "dev-1"}
        other = {"request": "dev", "driver": "other.example.com", "pool": node, "device": "x"}
        api.put_claim(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": "c", "namespace": "ns", "uid": uid},
                "spec": {},
                "status": {"allocation": {"devices": {"results": [result, other]}}},
            }
        )
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(ROOT / "bench" / "floor_dra.py"), "--driver-name", driver, "--node-name", node,
            "--kubeconfig", str(api.kubeconfig(tmp_path / "kubeconfig")), "--cdi-root", str(cdi), "--state-dir", str(state),
            "--num-devices", "3", "--plugins-registry-dir", str(registry), "--plugins-dir", str(tmp_path / "plugins"),
        )  # fmt: skip
        try:
            conn = await asyncio.wait_for(kubelet.wait_registered(driver), 30)
            assert conn.info.endpoint == str(tmp_path / "plugins" / driver / "dra.sock")
            (published,) = api.slices()
            assert published["spec"]["nodeName"] == node and published["spec"]["pool"]["name"] == node
            assert [d["name"] for d in published["spec"]["devices"]] == ["dev-0", "dev-1", "dev-2"]

            answer = (await conn.prepare([ClaimRef("ns", "c", uid)]))[uid]
            assert answer.error == ""
            (device,) = answer.devices
            assert (device.request_names, device.pool, device.device) == (("dev",), node, "dev-1")
            assert device.cdi_ids == (f"k8s.{driver}/device={uid}-dev-1",)
            (spec_file,) = cdi.iterdir()
            spec = json.loads(spec_file.read_text())
            assert spec["kind"] == f"k8s.{driver}/device"
            assert spec["devices"] == [{"name": f"{uid}-dev-1", "containerEdits": {"env": ["FLOOR_DEVICE_0=dev-1"]}}]
            assert uid in json.loads((state / "checkpoint.json").read_text())["claims"]
            wrong = (await conn.prepare([ClaimRef("ns", "c", "another-uid")]))["another-uid"]
            assert "UID" in wrong.error

            assert await conn.unprepare([ClaimRef("ns", "c", uid)]) == {uid: ""}
            assert list(cdi.iterdir()) == []
            assert json.loads((state / "checkpoint.json").read_text())["claims"] == {}
        finally:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 30) == 0
        assert api.slices() == []
        assert not kubelet.socket(driver).exists()


def test_bench_pci_scan_reports_the_scan_time() -> None:
    figures = run_bench("bench_pci_scan.py", "--pfs", "4", "--vfs", "8", "--runs", "2")
    assert figures["functions"] == 4 + 4 * 8  # the PFs and their VFs, all scanned
    assert figures["advertised"] > 0
    assert 0 < figures["scan_s"] <= figures["scan_s_max"]
    assert isinstance(figures["missed"], list)


def test_bench_generic_reports_every_figure_beside_its_floor() -> None:
    result = run_bench(
        "bench_generic.py", "--nodes", "20", "--usb", "20", "--rounds", "4", "--runs", "2", "--peer", "", "--peer-rounds", "1"
    )
    figures = result["figures"]
    for name in ("hotplug_ms_p50", "hotplug_ms_p95", "discover_nodes_ms", "discover_usb_ms", "rss_per_1000_devices_mib"):
        check_figure(name, figures[name], floor=True)
    check_missed(figures, result["missed"])


def test_bench_dra_reports_every_figure() -> None:
    figures = run_bench("bench_dra.py", "--claims", "5", "--devices", "300", "--concurrency", "1,4", "--rounds", "2")
    for key in (
        "prepare_ms_p50",
        "prepare_ms_p99",
        "unprepare_ms_p50",
        "unprepare_ms_p99",
        *(f"{op}_c{n}_ms_{q}" for op in ("prepare", "unprepare") for n in (1, 4) for q in ("p50", "p99")),
        "burst_c4_s",
        "rss_mib_after_bursts",
        "slice_publish_s",
        "slice_republish_s",
    ):
        assert isinstance(figures[key], (int, float)) and figures[key] > 0, key
    assert (figures["slices"], figures["devices_published"]) == (3, 300)  # 128 + 128 + 44, every device published
