"""The DRA health stream (cdiplug.dra.health.HealthFeed) over a real gRPC unix socket, v1alpha1 and v1beta1.

The first message lists every device of the pool; a health change sends the pool again; a quiet
pool is repeated after the heartbeat with a fresh ``last_updated_time``, well inside the
kubelet's 30 s freshness window; both versions carry a message naming the cause (field 5, as the
kubelet v1.36.2's own descriptor has it). Read through the
DRA kubelet stand-in's connection (the client the kubelet would be).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cdiplug.dra.health import HEARTBEAT, HealthFeed, add_to_server
from cdiplug.models.devices import Device, DeviceSnapshot, Health, HealthCause
from cdiplug.models.names import dns_label_for
from cdiplug.telemetry.recorder import NullRecorder
from cdiplug.testing.dra_kubelet import DeviceHealthReport, DraPluginConnection, PluginInfo
from cdiplug.wire.unixserver import UnixServer

FPGA = "example.com/fpga"


@pytest.fixture
async def served(short_tmp: Path) -> AsyncIterator[tuple[HealthFeed, DraPluginConnection]]:
    feed = HealthFeed("node-a", heartbeat=0.2)
    feed.update(DeviceSnapshot(FPGA, [Device("fpga-0"), Device("0000:3b:00.1")]))
    socket = short_tmp / "dra.sock"
    server = UnixServer(socket, lambda s: add_to_server(s, feed))
    await server.start()
    conn = DraPluginConnection(PluginInfo("DRAPlugin", "fpga.example.com", str(socket), ("v1.DRAPlugin",)), "v1.DRAPlugin", 5.0)
    try:
        yield feed, conn
    finally:
        await conn.close()
        await server.stop()


def health(message: list[DeviceHealthReport]) -> dict[str, str]:
    return {r.device: r.health for r in message}


@pytest.mark.parametrize("version", ["v1beta1", "v1alpha1"])
async def test_stream(served: tuple[HealthFeed, DraPluginConnection], version: str) -> None:
    feed, conn = served
    stream = conn.health_reports(version)
    first = await anext(stream)
    assert health(first) == {"fpga-0": "HEALTHY", dns_label_for("0000:3b:00.1"): "HEALTHY"}
    assert {r.pool for r in first} == {"node-a"}
    assert all(r.timeout_seconds >= 3 * feed.heartbeat * 0.99 for r in first)
    feed.update(DeviceSnapshot(FPGA, [Device("fpga-0", health=Health.UNHEALTHY)]))
    changed = await anext(stream)
    assert health(changed) == {"fpga-0": "UNHEALTHY"}
    assert "fpga-0" in changed[0].message and "unhealthy" in changed[0].message  # both versions carry the cause
    feed.update(DeviceSnapshot(FPGA, [Device("fpga-0", health=Health.UNHEALTHY, health_cause=HealthCause("xid", "79"))]))
    named = await anext(stream)
    assert health(named) == {"fpga-0": "UNHEALTHY"}
    assert "xid=79" in named[0].message and "cdiplug.dev/xid" in named[0].message  # the cause and its taint
    feed.update(DeviceSnapshot(FPGA, [Device("fpga-0")]))  # recovered
    recovered = await anext(stream)
    assert health(recovered) == {"fpga-0": "HEALTHY"} and "xid" not in recovered[0].message
    await stream.aclose()


async def test_every_message_sent_is_counted_per_driver(served: tuple[HealthFeed, DraPluginConnection]) -> None:
    feed, conn = served
    sent: list[tuple[str, str]] = []

    class Counting(NullRecorder):
        def health_sent(self, resource: str, driver: str) -> None:
            sent.append((resource, driver))

    feed.resource, feed.driver, feed.recorder = FPGA, "fpga.example.com", Counting()
    stream = conn.health_reports("v1beta1")
    await anext(stream)
    feed.update(DeviceSnapshot(FPGA, [Device("fpga-0", health=Health.UNHEALTHY)]))
    await anext(stream)
    await stream.aclose()
    # Counted as each message is made: the two read, and at most one the server had ready next.
    assert 2 <= len(sent) <= 3 and set(sent) == {(FPGA, "fpga.example.com")}


@pytest.mark.parametrize("version", ["v1beta1", "v1alpha1"])
async def test_quiet_pool_is_sent_again_within_the_window(served: tuple[HealthFeed, DraPluginConnection], version: str) -> None:
    feed, conn = served
    stream = conn.health_reports(version)
    await anext(stream)
    started = time.monotonic()
    again = await anext(stream)  # nothing changed: the heartbeat repeats the whole pool
    waited = time.monotonic() - started
    assert health(again) == {"fpga-0": "HEALTHY", dns_label_for("0000:3b:00.1"): "HEALTHY"}
    assert feed.heartbeat * 0.5 <= waited < feed.heartbeat * 10
    assert all(abs(r.last_updated_time - time.time()) < 5 for r in again)
    await stream.aclose()


def test_heartbeat_stays_inside_the_kubelets_window() -> None:
    assert HEARTBEAT * 2 < 30  # the kubelet takes 30 s without news as Unknown
    assert HealthFeed("node-a").heartbeat == HEARTBEAT
    for bad in (0, -1, 25):
        with pytest.raises(ValueError, match="heartbeat"):
            HealthFeed("node-a", heartbeat=bad)
