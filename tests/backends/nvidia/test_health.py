"""GPU health in the NVIDIA backend, driven by FakeNvml's scripted XID events and probe failures.

Covers: an XID makes the GPU Unhealthy at once; application XIDs are ignored (and the list is
configurable); an unhealthy GPU is Healthy again only after N clean probes in a row; an event that
names no GPU (or a failing wait) re-probes every GPU instead of taking them all down; the event
thread and NVML session end cleanly; no NVML or no GPU gives empty snapshots and one log line, or
BackendInitError with ``fail_on_init_error``. The backend runs for real on the event loop; only
NVML and the sysfs/dev folders are fakes.
"""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from cdiplug.errors import BackendInitError
from cdiplug.models.devices import Health, HealthCause
from cdiplug.models.world import World
from cdiplug_backends.nvidia.health import PROBE_FAILED, EventWatcher, HealthTracker, Verdict, classify
from cdiplug_backends.nvidia.nvml import Nvml, NvmlEvent
from cdiplug_backends.nvidia.testing import FakeNvml
from cdiplug_backends.nvidia.testing import nvml as fake_module

GPU = "nvidia.com/gpu"


def xid_thread_alive() -> bool:
    return any(t.name == "cdiplug-nvidia-xid-events" and t.is_alive() for t in threading.enumerate())


def test_classify() -> None:
    known = {"GPU-a"}
    ignored = (13, 43)
    assert classify(NvmlEvent("GPU-a", 8, 79, True), known, ignored) is Verdict.UNHEALTHY
    assert classify(NvmlEvent("GPU-a", 8, 13, True), known, ignored) is Verdict.IGNORE
    assert classify(NvmlEvent("GPU-b", 8, 79, True), known, ignored) is Verdict.IGNORE  # not ours
    assert classify(NvmlEvent("GPU-a", 1, 0, False), known, ignored) is Verdict.IGNORE  # not an XID
    assert classify(NvmlEvent(None, 8, 79, True), known, ignored) is Verdict.REPROBE


def test_tracker_needs_n_clean_probes_in_a_row() -> None:
    t = HealthTracker(clean_needed=3)
    assert t.health("GPU-a") is Health.HEALTHY and not t.probe_passed("GPU-a")
    assert t.mark_unhealthy("GPU-a", "XID 79") and not t.mark_unhealthy("GPU-a", "XID 79")
    assert not t.probe_passed("GPU-a") and not t.probe_passed("GPU-a")
    assert not t.probe_failed("GPU-a", "lost")  # back to zero clean probes
    assert t.reason("GPU-a") == "lost" and t.causes() == {"GPU-a": PROBE_FAILED}
    assert [t.probe_passed("GPU-a") for _ in range(3)] == [False, False, True]
    assert t.health("GPU-a") is Health.HEALTHY and t.health_map() == {}


def test_watcher_starts_and_stops_cleanly(world: World, nv) -> None:
    fake = FakeNvml.pcie_box()
    nvml = Nvml(fake)
    nvml.init()
    from cdiplug_backends.nvidia.discovery import discover

    gpus = discover(nvml, nv.machine(world, fake)).gpus
    seen: list[NvmlEvent] = []
    got = threading.Event()
    watcher = EventWatcher(nvml, gpus, lambda e: (seen.append(e), got.set()), lambda m: None, wait_ms=20)
    assert watcher.start() == {}
    assert watcher.running and fake.registered_count() == 4
    fake.inject_xid(gpus[2].uuid, 48)
    assert got.wait(2)
    assert (seen[0].uuid, seen[0].data) == (gpus[2].uuid, 48)
    watcher.stop()
    watcher.stop()  # idempotent
    assert not watcher.running and fake.open_event_sets == 0


def test_stop_before_start_wins(world: World) -> None:
    fake = FakeNvml.pcie_box()
    nvml = Nvml(fake)
    nvml.init()
    watcher = EventWatcher(nvml, [], lambda e: None, lambda m: None)
    watcher.stop()
    assert watcher.start() == {} and not watcher.running and fake.open_event_sets == 0


async def test_xid_makes_the_gpu_unhealthy_at_once_and_ignored_xids_do_not(world: World, nv, sink) -> None:
    fake = FakeNvml.nvlink_pairs()
    w = nv.machine(world, fake)
    res = nv.resources({"name": GPU, "options": {"reprobe_interval_s": 3600}})
    a, b, c = (g.uuid for g in fake.gpus[:3])
    async with nv.running(nv.backend(res, w), sink):
        assert await asyncio.to_thread(fake.wait_registered)
        for xid in (13, 31, 43, 45, 68, 109):
            fake.inject_xid(a, xid)
        fake.inject_xid(b, 79)
        loop = asyncio.get_running_loop()
        started = loop.time()
        await sink.wait_for(lambda latest: latest[GPU].get(b).health is Health.UNHEALTHY, timeout=2)
        assert loop.time() - started < 1.0
        health = sink.health(GPU)
        assert health[a] == health[c] == "Healthy"  # events are handled in order: a's came first
        assert sum(1 for v in health.values() if v == "Unhealthy") == 1
        # The cause goes with it (DRA taint cdiplug.dev/xid=79); healthy GPUs carry none.
        latest = sink.latest[GPU]
        assert latest.get(b).cause == HealthCause("xid", "79") and latest.get(a).cause is None


async def test_ignored_xids_are_configurable(world: World, nv, sink) -> None:
    fake = FakeNvml.pcie_box()
    w = nv.machine(world, fake)
    res = nv.resources({"name": GPU, "options": {"ignored_xids": [79], "reprobe_interval_s": 3600}})
    a, b = fake.gpus[0].uuid, fake.gpus[1].uuid
    async with nv.running(nv.backend(res, w), sink):
        assert await asyncio.to_thread(fake.wait_registered)
        fake.inject_xid(a, 79)
        fake.inject_xid(b, 13)  # no longer ignored: the list replaces the default
        await sink.wait_for(lambda latest: latest[GPU].get(b).health is Health.UNHEALTHY)
        assert sink.health(GPU)[a] == "Healthy"


async def test_recovery_after_n_clean_probes(world: World, nv, sink) -> None:
    fake = FakeNvml.pcie_box()
    w = nv.machine(world, fake)
    res = nv.resources({"name": GPU, "options": {"reprobe_interval_s": 0.02, "clean_probes": 3}})
    lost = fake.gpus[3].uuid
    async with nv.running(nv.backend(res, w), sink):
        assert await asyncio.to_thread(fake.wait_registered)
        fake.fail_probe(lost)
        fake.inject_xid(lost, 79)
        await sink.wait_for(lambda latest: latest[GPU].get(lost).health is Health.UNHEALTHY)
        # While NVML cannot reach it, probing keeps it down.
        before = fake.calls["nvmlDeviceGetHandleByUUID"]
        await asyncio.sleep(0.2)
        assert fake.calls["nvmlDeviceGetHandleByUUID"] - before >= 3
        assert sink.health(GPU)[lost] == "Unhealthy"
        fake.heal(lost)
        healed_at = fake.calls["nvmlDeviceGetHandleByUUID"]
        await sink.wait_for(lambda latest: latest[GPU].get(lost).health is Health.HEALTHY)
        assert fake.calls["nvmlDeviceGetHandleByUUID"] - healed_at >= 3
        # A new XID takes it down again at once, and the count starts over.
        fake.inject_xid(lost, 48)
        await sink.wait_for(lambda latest: latest[GPU].get(lost).health is Health.UNHEALTHY)
    healths = [s.get(lost).health for s in sink.history]
    assert healths == [Health.HEALTHY, Health.UNHEALTHY, Health.HEALTHY, Health.UNHEALTHY]
    # NVML cannot name a lost GPU's event, so the probe takes it down (and keeps its cause while
    # it fails); recovered, it has none; then the XID it reports.
    causes = [s.get(lost).cause for s in sink.history]
    assert causes == [None, PROBE_FAILED, None, HealthCause("xid", "48")]


async def test_an_event_naming_no_gpu_reprobes_instead_of_taking_all_down(world: World, nv, sink) -> None:
    fake = FakeNvml.nvswitch8()
    w = nv.machine(world, fake)
    res = nv.resources(
        {"name": "nvidia.com/numa0", "options": {"selectors": [{"indices": [0, 1, 2, 3]}], "reprobe_interval_s": 3600}},
        {"name": "nvidia.com/numa1", "options": {"reprobe_interval_s": 3600}},
    )
    broken = fake.gpus[6].uuid
    async with nv.running(nv.backend(res, w), sink):
        assert await asyncio.to_thread(fake.wait_registered)
        fake.fail_probe(broken)  # broke silently: only a probe finds out
        fake.inject_xid(None, 79)
        await sink.wait_for(lambda latest: latest["nvidia.com/numa1"].get(broken).health is Health.UNHEALTHY)
        assert list(sink.health("nvidia.com/numa1").values()).count("Unhealthy") == 1
        assert set(sink.health("nvidia.com/numa0").values()) == {"Healthy"}


async def test_a_failing_wait_reprobes_too(world: World, nv, sink, caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeNvml.pcie_box()
    w = nv.machine(world, fake)
    res = nv.resources({"name": GPU, "options": {"reprobe_interval_s": 3600}})
    broken = fake.gpus[0].uuid
    async with nv.running(nv.backend(res, w), sink):
        assert await asyncio.to_thread(fake.wait_registered)
        fake.fail_probe(broken)
        fake.fail_wait(fake_module.NVML_ERROR_UNKNOWN)
        await sink.wait_for(lambda latest: latest[GPU].get(broken).health is Health.UNHEALTHY)
    assert "waiting for NVML events failed" in caplog.text


async def test_gpus_that_cannot_report_xids_stay_healthy(world: World, nv, sink) -> None:
    fake = FakeNvml.pcie_box()
    fake.gpus[1].supported_events = 0
    w = nv.machine(world, fake)
    async with nv.running(nv.backend(nv.resources({"name": GPU}), w), sink):
        assert await asyncio.to_thread(fake.wait_registered, 3)
        assert set(sink.health(GPU).values()) == {"Healthy"}


async def test_stops_cleanly(world: World, nv, sink) -> None:
    fake = FakeNvml.nvswitch8()
    w = nv.machine(world, fake)
    async with nv.running(nv.backend(nv.resources({"name": GPU}), w), sink):
        assert await asyncio.to_thread(fake.wait_listening)
        assert xid_thread_alive() and fake.inits == 1
    assert not xid_thread_alive()
    assert fake.inits == 0 and fake.open_event_sets == 0


@pytest.mark.parametrize("machine", ["no library", "no GPU"])
async def test_without_nvml_or_gpus_resources_are_empty_and_others_go_on(
    world: World, nv, sink, caplog: pytest.LogCaptureFixture, machine: str
) -> None:
    fake = FakeNvml.pcie_box() if machine == "no library" else FakeNvml([])
    if machine == "no library":
        fake.fail_init(fake_module.NVML_ERROR_LIBRARY_NOT_FOUND)
    w = nv.machine(world, fake)
    res = nv.resources({"name": GPU, "cdi_kind": "cdiplug.nvidia.com/gpu"}, {"name": "nvidia.com/other"})
    with caplog.at_level(logging.WARNING):
        async with nv.running(nv.backend(res, w), sink) as task:
            await asyncio.sleep(0.05)
            assert not task.done()  # it waits, serving empty resources, until cancelled
    assert sink.latest[GPU].devices == () and sink.latest["nvidia.com/other"].devices == ()
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and warnings[0].exc_info is None
    assert "resources nvidia.com/gpu, nvidia.com/other advertise no GPUs" in warnings[0].getMessage()
    if machine == "no library":
        assert "NVML_ERROR_LIBRARY_NOT_FOUND" in warnings[0].getMessage()
        assert sink.latest[GPU].skipped and sink.latest[GPU].skipped[0][0] == "NVML"
    assert fake.inits == 0


@pytest.mark.parametrize("machine", ["no library", "no GPU", "no match"])
async def test_fail_on_init_error_raises_backend_init_error(world: World, nv, sink, machine: str) -> None:
    fake = FakeNvml([]) if machine == "no GPU" else FakeNvml.pcie_box()
    if machine == "no library":
        fake.fail_init(fake_module.NVML_ERROR_DRIVER_NOT_LOADED)
    w = nv.machine(world, fake)
    selectors = [{"model": "*H100*"}] if machine == "no match" else []
    res = nv.resources(
        {"name": "nvidia.com/any"} if machine == "no match" else {"name": "nvidia.com/lenient"},
        {"name": "nvidia.com/strict", "options": {"fail_on_init_error": True, "selectors": selectors}},
    )
    with pytest.raises(BackendInitError, match="resource nvidia.com/strict sets fail_on_init_error") as caught:
        await asyncio.wait_for(nv.backend(res, w).run(sink), 5)
    assert "\n" not in str(caught.value)
    assert fake.inits == 0 and not xid_thread_alive()
