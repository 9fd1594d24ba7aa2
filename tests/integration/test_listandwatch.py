"""ListAndWatch end to end: the fake backend's health file to the kubelet's stream.

Real gRPC over unix sockets in a short temporary folder; the daemon runs in the test's event loop
with the fake backend, the kubelet stand-in holds its stream, and the test opens more streams
itself with a plain grpc.aio client. Covers: a health change reaches every stream (and the
kubelet's allocatable) promptly; several streams for one resource, one cancelled while the others
go on; topology as the kubelet reads it; a kubelet restart ending the old streams cleanly.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import yaml

from cdiplug.api import deviceplugin_v1beta1_pb2 as pb
from cdiplug.api import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from cdiplug.daemon import Daemon
from cdiplug.models.world import World
from cdiplug.testing import KubeletStandIn

FPGA, NIC = "example.com/fpga", "example.com/nic"


@pytest.fixture
def health_file(short_tmp: Path) -> Path:
    return short_tmp / "health" / "fpga.yaml"


@pytest.fixture
async def kubelet(world: World, short_tmp: Path, health_file: Path) -> AsyncIterator[KubeletStandIn]:
    health_file.parent.mkdir()
    config = short_tmp / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "resources": [
                    {"name": FPGA, "backend": "fake", "options": {"count": 2, "health_file": str(health_file)}},
                    {"name": NIC, "backend": "fake", "options": {"count": 4, "numa_nodes": [0, 1]}},
                ]
            }
        )
    )
    d = Daemon(config, world)
    async with KubeletStandIn(world.kubelet_dir) as kubelet:
        task = asyncio.create_task(d.run(handle_signals=False), name="daemon under test")
        try:
            for name in (FPGA, NIC):
                await kubelet.wait_registered(name, timeout=10)
            yield kubelet
        finally:
            d.request_stop()
            assert await asyncio.wait_for(task, 10) == 0


@contextlib.asynccontextmanager
async def stream(world: World, resource: str) -> AsyncIterator[grpc.aio.UnaryStreamCall]:
    path = world.kubelet_dir / (resource.replace("/", "-") + ".sock")
    async with grpc.aio.insecure_channel(f"unix://{path}") as channel:
        call = pb_grpc.DevicePluginStub(channel).ListAndWatch(pb.Empty())
        try:
            yield call
        finally:
            call.cancel()


def write_health(path: Path, health: dict[str, str]) -> None:
    temp = path.with_suffix(".tmp")
    temp.write_text(yaml.safe_dump(health))
    temp.replace(path)  # atomically, as a config management tool would


async def read(call: grpc.aio.UnaryStreamCall) -> pb.ListAndWatchResponse:
    message = await asyncio.wait_for(call.read(), 5)
    assert message is not grpc.aio.EOF
    return message


def health_of(message: pb.ListAndWatchResponse) -> dict[str, str]:
    return {d.ID: d.health for d in message.devices}


async def test_health_change_reaches_the_stream_quickly(kubelet: KubeletStandIn, world: World, health_file: Path) -> None:
    async with stream(world, FPGA) as call:
        assert health_of(await read(call)) == {"fpga-0": "Healthy", "fpga-1": "Healthy"}
        changed = time.monotonic()
        write_health(health_file, {"fpga-1": "Unhealthy"})
        assert health_of(await read(call)) == {"fpga-0": "Healthy", "fpga-1": "Unhealthy"}
        took = time.monotonic() - changed
        await kubelet.wait_until(lambda: kubelet.allocatable(FPGA) == 1, 5, "allocatable 1")
    # The goal is 50 ms (bench/ measures it); a loaded CI machine gets more slack here.
    print(f"health change reached the stream in {took * 1000:.1f} ms")
    assert took < 0.5, f"health change took {took * 1000:.1f} ms to reach the stream"
    write_health(health_file, {})
    await kubelet.wait_until(lambda: kubelet.allocatable(FPGA) == 2, 5, "allocatable 2 again")


async def test_several_streams_for_one_resource(kubelet: KubeletStandIn, world: World, health_file: Path) -> None:
    async with stream(world, FPGA) as first, stream(world, FPGA) as second, stream(world, FPGA) as third:
        for call in (first, second, third):
            assert len((await read(call)).devices) == 2
        write_health(health_file, {"fpga-0": "Unhealthy"})
        for call in (first, second, third):
            assert health_of(await read(call))["fpga-0"] == "Unhealthy"
        await kubelet.wait_until(lambda: kubelet.allocatable(FPGA) == 1, 5)
        first.cancel()
        write_health(health_file, {"fpga-0": "Unhealthy", "fpga-1": "Unhealthy"})
        for call in (second, third):
            assert set(health_of(await read(call)).values()) == {"Unhealthy"}
        await kubelet.wait_until(lambda: kubelet.allocatable(FPGA) == 0, 5)
        assert await first.code() == grpc.StatusCode.CANCELLED


async def test_topology_as_the_kubelet_reads_it(kubelet: KubeletStandIn, world: World) -> None:
    async with stream(world, NIC) as call:
        message = await read(call)
    assert [(d.ID, [n.ID for n in d.topology.nodes]) for d in message.devices] == [
        ("nic-0", [0]),
        ("nic-1", [1]),
        ("nic-2", [0]),
        ("nic-3", [1]),
    ]
    async with stream(world, FPGA) as call:
        assert not any(d.HasField("topology") for d in (await read(call)).devices)  # unknown: no field


async def test_a_kubelet_restart_ends_the_old_streams_cleanly(kubelet: KubeletStandIn, world: World) -> None:
    async with stream(world, NIC) as call:
        await read(call)
        await kubelet.restart(wipe=False)  # the socket stays; only the registration is new
        assert await asyncio.wait_for(call.read(), 5) is grpc.aio.EOF
        assert await call.code() == grpc.StatusCode.OK
    await kubelet.wait_until(lambda: sum(r.resource == NIC for r in kubelet.registrations) == 2 and kubelet.is_registered(NIC), 5)
    assert kubelet.allocatable(NIC) == 4
