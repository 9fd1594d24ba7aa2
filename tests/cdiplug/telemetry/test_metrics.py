"""Metrics and health endpoints: real HTTP against ``Metrics.serve`` on 127.0.0.1 port 0.

Covers the exposition after the recording calls (parsed with prometheus-client's own parser),
``/healthz`` answering 200 while the event loop runs and 503 while it is blocked, ``/readyz``
going 503 -> 200 as resources register, ``forget``, and the address parsing errors.
"""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.parser import text_string_to_metric_families

from cdiplug.errors import ConfigError
from cdiplug.telemetry.metrics import Metrics, MetricsAddressError, MetricsServerError, parse_address

FPGA = "example.com/fpga"
NIC = "example.com/nic-vfio"


def _get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers["Content-Type"], err.read().decode()


async def get(url: str) -> tuple[int, str, str]:
    # From a thread: a request made on the loop would be answered only once the loop is free.
    return await asyncio.to_thread(_get, url)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def test_metrics_exposition_after_calls() -> None:
    metrics = Metrics()
    metrics.registered(FPGA, again=False)
    metrics.registered(FPGA, again=True)
    metrics.allocate_observed(FPGA, 0.003, ok=True)
    metrics.allocate_observed(FPGA, 0.7, ok=True)
    metrics.allocate_observed(FPGA, 0.001, ok=False)
    metrics.devices(FPGA, healthy=3, unhealthy=1)
    metrics.devices(NIC, healthy=0, unhealthy=0)
    metrics.preparation_failed(NIC)
    metrics.kubelet_restart()
    async with metrics.serve("127.0.0.1:0") as server:
        assert server.port != 0
        status, content_type, body = await get(server.url + "/metrics")
    assert status == 200
    assert content_type.startswith("text/plain")
    got = samples(body)
    r = (("resource", FPGA),)
    assert got[("cdiplug_registrations_total", r)] == 1
    assert got[("cdiplug_reregistrations_total", r)] == 1
    assert got[("cdiplug_allocations_total", (("resource", FPGA), ("result", "ok")))] == 2
    assert got[("cdiplug_allocations_total", (("resource", FPGA), ("result", "error")))] == 1
    assert got[("cdiplug_allocate_duration_seconds_count", r)] == 3
    assert got[("cdiplug_allocate_duration_seconds_sum", r)] == pytest.approx(0.704)
    assert got[("cdiplug_allocate_duration_seconds_bucket", (("le", "0.005"), ("resource", FPGA)))] == 2
    assert got[("cdiplug_allocate_duration_seconds_bucket", (("le", "1.0"), ("resource", FPGA)))] == 3
    assert got[("cdiplug_devices", (("health", "healthy"), ("resource", FPGA)))] == 3
    assert got[("cdiplug_devices", (("health", "unhealthy"), ("resource", FPGA)))] == 1
    assert got[("cdiplug_preparation_failures_total", (("resource", NIC),))] == 1
    assert got[("cdiplug_kubelet_restarts_total", ())] == 1
    assert got[("cdiplug_resource_ready", r)] == 1
    assert got[("process_resident_memory_bytes", ())] > 0


async def test_openmetrics_when_asked() -> None:
    metrics = Metrics()
    metrics.kubelet_restart()
    async with metrics.serve("127.0.0.1:0") as server:
        request = urllib.request.Request(server.url + "/metrics", headers={"Accept": "application/openmetrics-text"})
        response = await asyncio.to_thread(urllib.request.urlopen, request, timeout=10)
        with response:
            assert response.headers["Content-Type"].startswith("application/openmetrics-text")
            assert response.read().decode().rstrip().endswith("# EOF")


async def test_own_registry_never_the_global_one() -> None:
    one, two = Metrics(), Metrics()  # would raise "Duplicated timeseries" in a shared registry
    one.kubelet_restart()
    assert one.registry.get_sample_value("cdiplug_kubelet_restarts_total") == 1
    assert two.registry.get_sample_value("cdiplug_kubelet_restarts_total") == 0
    given = CollectorRegistry()
    Metrics(given).preparation_failed(FPGA)
    assert given.get_sample_value("cdiplug_preparation_failures_total", {"resource": FPGA}) == 1


async def test_healthz_follows_the_event_loop() -> None:
    metrics = Metrics(health_timeout=0.3)
    async with metrics.serve("127.0.0.1:0") as server:
        assert (await get(server.url + "/healthz"))[0] == 200

        # Block the loop on purpose (as a stuck sysfs read would) while a thread asks /healthz.
        answer: list[tuple[int, str, str]] = []
        asked = threading.Thread(target=lambda: answer.append(_get(server.url + "/healthz")))
        asked.start()
        time.sleep(1.0)
        await asyncio.to_thread(asked.join)
        status, _, body = answer[0]
        assert status == 503
        assert "did not answer within 0.3s" in body

        assert (await get(server.url + "/healthz"))[0] == 200


async def test_readyz_until_every_configured_resource_registers() -> None:
    metrics = Metrics()
    async with metrics.serve("127.0.0.1:0") as server:
        status, _, body = await get(server.url + "/readyz")
        assert (status, body) == (503, "not ready: no resources configured yet\n")
        assert not metrics.ready()

        metrics.configure([FPGA, NIC])
        status, _, body = await get(server.url + "/readyz")
        assert status == 503
        assert f"{FPGA}, {NIC}" in body

        metrics.registered(FPGA, again=False)
        status, _, body = await get(server.url + "/readyz")
        assert status == 503
        assert NIC in body and FPGA not in body

        metrics.set_ready(NIC, True)
        assert metrics.ready()
        assert (await get(server.url + "/readyz"))[:3:2] == (200, "ready\n")

        # The kubelet restarted: not ready until the resource registers again.
        metrics.set_ready(FPGA, False)
        assert (await get(server.url + "/readyz"))[0] == 503
        metrics.registered(FPGA, again=True)
        assert (await get(server.url + "/readyz"))[0] == 200

        assert (await get(server.url + "/nothing"))[0] == 404


async def test_forget_drops_the_series_and_readiness() -> None:
    metrics = Metrics()
    metrics.configure([FPGA])
    metrics.registered(FPGA, again=False)
    metrics.devices(FPGA, 2, 0)
    metrics.allocate_observed(FPGA, 0.01, ok=True)
    metrics.forget(FPGA)
    metrics.forget(FPGA)  # twice is fine
    assert not metrics.ready()
    assert metrics.registry.get_sample_value("cdiplug_devices", {"resource": FPGA, "health": "healthy"}) is None
    assert metrics.registry.get_sample_value("cdiplug_allocate_duration_seconds_count", {"resource": FPGA}) is None
    metrics.devices(FPGA, 1, 1)  # and it comes back when used again
    assert metrics.registry.get_sample_value("cdiplug_devices", {"resource": FPGA, "health": "unhealthy"}) == 1


async def test_await_form_and_server_stops() -> None:
    metrics = Metrics()
    async with await metrics.serve("127.0.0.1:0") as server:
        url = server.url
        assert (await get(url + "/healthz"))[0] == 200
    with pytest.raises(urllib.error.URLError):
        await asyncio.to_thread(urllib.request.urlopen, url + "/healthz", timeout=5)


async def test_port_in_use_is_a_clear_error() -> None:
    async with Metrics().serve("127.0.0.1:0") as first:
        with pytest.raises(MetricsServerError, match=f"cannot listen on 127.0.0.1:{first.port}"):
            async with Metrics().serve(f"127.0.0.1:{first.port}"):
                pass


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("127.0.0.1:9100", ("127.0.0.1", 9100)),
        (":9100", ("0.0.0.0", 9100)),
        ("[::1]:0", ("::1", 0)),
        ("localhost:8080", ("localhost", 8080)),
    ],
)
def test_parse_address(address: str, expected: tuple[str, int]) -> None:
    assert parse_address(address) == expected


@pytest.mark.parametrize(
    ("address", "message"),
    [
        ("9100", "expected HOST:PORT"),
        ("127.0.0.1:http", "port 'http' is not a number"),
        ("127.0.0.1:70000", "port '70000' is not a number from 0 to 65535"),
        ("::1:9100", "IPv6 host in brackets"),
        ("[nope]:9100", "is not an IPv6 address"),
    ],
)
def test_bad_address(address: str, message: str) -> None:
    with pytest.raises(MetricsAddressError, match=message) as caught:
        Metrics().serve(address)
    assert isinstance(caught.value, ConfigError)  # the CLI exits with status 2
    assert str(caught.value).startswith(f"--metrics-address {address!r}: ")


def test_recording_looks_labels_up_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Allocate path must not call ``labels()`` (a lock and a key built) on every call."""
    metrics = Metrics()
    for call in (
        lambda: metrics.allocate_observed(FPGA, 0.001, ok=True),
        lambda: metrics.devices(FPGA, 1, 0),
        lambda: metrics.registered(FPGA, again=True),
        lambda: metrics.preparation_failed(FPGA),
    ):
        call()

    def no_labels(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("labels() called on the hot path")

    monkeypatch.setattr(MetricWrapperBase, "labels", no_labels)
    metrics.allocate_observed(FPGA, 0.002, ok=False)
    metrics.devices(FPGA, 0, 1)
    metrics.registered(FPGA, again=True)
    metrics.preparation_failed(FPGA)
    assert metrics.registry.get_sample_value("cdiplug_allocations_total", {"resource": FPGA, "result": "error"}) == 1


def test_healthz_when_the_loop_is_gone() -> None:
    """The server thread outlives a loop that was closed without leaving the context: 503."""
    metrics = Metrics()
    loop = asyncio.new_event_loop()
    server = loop.run_until_complete(metrics.serve("127.0.0.1:0").__aenter__())
    loop.close()
    try:
        status, _, body = _get(server.url + "/healthz")
        assert status == 503 and "event loop not running" in body
    finally:
        asyncio.run(server.__aexit__(None, None, None))


def test_dra_claims_are_counted_apart_from_allocate() -> None:
    """Prepare and unprepare per driver, with latency and failures; no Allocate counted; forget drops them."""
    metrics = Metrics(CollectorRegistry())
    metrics.prepare_observed(FPGA, "fpga.example.com", 0.004, ok=True)
    metrics.prepare_observed(FPGA, "fpga.example.com", 0.002, ok=False)
    metrics.unprepare_observed(FPGA, "fpga.example.com", 0.001, ok=True)
    from prometheus_client import generate_latest

    got = samples(generate_latest(metrics.registry).decode())
    d = ("driver", "fpga.example.com")
    assert got[("cdiplug_dra_claim_operations_total", (d, ("operation", "prepare"), ("result", "ok")))] == 1
    assert got[("cdiplug_dra_claim_operations_total", (d, ("operation", "prepare"), ("result", "error")))] == 1
    assert got[("cdiplug_dra_claim_operations_total", (d, ("operation", "unprepare"), ("result", "ok")))] == 1
    assert got[("cdiplug_dra_claim_operation_duration_seconds_count", (d, ("operation", "prepare")))] == 2
    assert got[("cdiplug_dra_claim_operation_duration_seconds_sum", (d, ("operation", "prepare")))] == pytest.approx(0.006)
    assert not [k for k in got if k[0].startswith("cdiplug_allocat")]
    metrics.forget(FPGA)
    assert not [k for k in samples(generate_latest(metrics.registry).decode()) if k[0].startswith("cdiplug_dra_")]


def test_dra_claims_prepared_slice_publishes_and_health_messages_per_driver() -> None:
    """The DRA path beyond prepare/unprepare: claims prepared now (a gauge), slice publishes and
    their failures, health messages sent, each per driver; forget drops them with the resource."""
    from prometheus_client import generate_latest

    metrics = Metrics(CollectorRegistry())
    fpga, gpu = ("driver", "fpga.example.com"), ("driver", "gpu.example.com")
    metrics.claims_prepared(FPGA, "fpga.example.com", 3)
    metrics.claims_prepared(FPGA, "fpga.example.com", 2)  # a gauge: the latest count, not a sum
    metrics.claims_prepared("example.com/gpu", "gpu.example.com", 1)
    for ok in (True, True, False):
        metrics.slices_published(FPGA, "fpga.example.com", ok=ok)
    for _ in range(4):
        metrics.health_sent(FPGA, "fpga.example.com")
    got = samples(generate_latest(metrics.registry).decode())
    assert got[("cdiplug_dra_claims_prepared", (fpga,))] == 2
    assert got[("cdiplug_dra_claims_prepared", (gpu,))] == 1
    assert got[("cdiplug_dra_slice_publishes_total", (fpga, ("result", "ok")))] == 2
    assert got[("cdiplug_dra_slice_publishes_total", (fpga, ("result", "error")))] == 1
    assert got[("cdiplug_dra_health_messages_total", (fpga,))] == 4
    assert got[("cdiplug_dra_health_messages_total", (gpu,))] == 0  # the other driver's own series
    metrics.forget(FPGA)
    left = {k for k in samples(generate_latest(metrics.registry).decode()) if k[0].startswith("cdiplug_dra_")}
    assert left and all(dict(labels)["driver"] == "gpu.example.com" for _, labels in left)
