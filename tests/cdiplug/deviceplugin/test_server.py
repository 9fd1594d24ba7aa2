"""cdiplug.deviceplugin.server: the DevicePlugin gRPC edge of one resource.

Real gRPC over a unix socket in a short temporary folder, a real grpc.aio client; the allocator is a
small scripted fake defined here, so that these tests cover the edge alone: socket handling (stale
removed, live refused, mode 0600, removed on stop), ListAndWatch (first list at once, full lists on
change, coalescing, several streams, clean ends both ways), protobuf conversion of devices and
allocations, options, and the mapping of our exceptions to gRPC status codes.
"""

from __future__ import annotations

import asyncio
import socket
import stat
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import grpc
import pytest

from cdiplug.api import deviceplugin_v1beta1_pb2 as pb
from cdiplug.api import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from cdiplug.deviceplugin.server import ResourceServer
from cdiplug.errors import (
    CdiError,
    CdiplugError,
    DeviceInUse,
    DeviceUnavailable,
    InvalidRequest,
    PreparationError,
    SocketInUse,
)
from cdiplug.models.devices import (
    ContainerAllocation,
    Device,
    DeviceNode,
    DeviceSnapshot,
    Health,
    Mount,
    PreferredRequest,
)
from cdiplug.testing.poll import eventually

RESOURCE = "example.com/fpga"
SOCKET = "example.com-fpga.sock"


class ScriptedAllocator:
    """Records calls; answers from ``answers`` or raises ``error``."""

    def __init__(self) -> None:
        self.error: BaseException | None = None
        self.allocate_calls: list[list[list[str]]] = []
        self.preferred_calls: list[list[PreferredRequest]] = []

    async def allocate(self, requests: Sequence[Sequence[str]]) -> list[ContainerAllocation]:
        self.allocate_calls.append([list(r) for r in requests])
        if self.error is not None:
            raise self.error
        return [
            ContainerAllocation(
                device_ids=ids,
                env={"FPGA_IDS": ",".join(ids)},
                device_specs=[DeviceNode(path=f"/dev/{i}", host_path=f"/host/dev/{i}", permissions="rw") for i in ids]
                + [DeviceNode(path="/dev/ctl")],
                mounts=[Mount(host_path="/opt/lib", container_path="/usr/lib/fpga", read_only=True)],
                cdi_devices=[f"example.com/fpga={i}" for i in ids],
                annotations={"cdi.k8s.io/cdiplug_x": "example.com/fpga=" + ids[0]},
            )
            for ids in requests
        ]

    def preferred(self, requests: Sequence[PreferredRequest]) -> list[tuple[str, ...]]:
        self.preferred_calls.append(list(requests))
        if self.error is not None:
            raise self.error
        return [
            tuple(r.must_include) + tuple(i for i in r.available if i not in r.must_include)[: r.size - len(r.must_include)]
            for r in requests
        ]


def snapshot(*health: Health, numa: Sequence[Sequence[int]] = ()) -> DeviceSnapshot:
    devices = [Device(id=f"fpga-{i}", health=h, numa_nodes=numa[i] if numa else ()) for i, h in enumerate(health)]
    return DeviceSnapshot(resource=RESOURCE, devices=devices)


@pytest.fixture
def allocator() -> ScriptedAllocator:
    return ScriptedAllocator()


@pytest.fixture
async def server(short_tmp: Path, allocator: ScriptedAllocator) -> AsyncIterator[ResourceServer]:
    srv = ResourceServer(RESOURCE, SOCKET, short_tmp, allocator)
    await srv.start()
    try:
        yield srv
    finally:
        await srv.stop()


@pytest.fixture
async def stub(server: ResourceServer) -> AsyncIterator[pb_grpc.DevicePluginStub]:
    async with grpc.aio.insecure_channel(f"unix://{server.socket_path}") as channel:
        yield pb_grpc.DevicePluginStub(channel)


def listening_socket(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen()
    return sock


# -- the socket ------------------------------------------------------------------------------


async def test_serves_on_the_socket_with_mode_0600(server: ResourceServer, short_tmp: Path) -> None:
    path = short_tmp / SOCKET
    assert server.socket_path == path
    assert stat.S_ISSOCK(path.lstat().st_mode)
    assert stat.S_IMODE(path.lstat().st_mode) == 0o600
    assert server.serving and server.socket_present()


async def test_stop_removes_the_socket(server: ResourceServer) -> None:
    await server.stop()
    assert not server.socket_path.exists()
    assert not server.serving


async def test_stale_socket_is_removed_first(short_tmp: Path, allocator: ScriptedAllocator) -> None:
    path = short_tmp / SOCKET
    dead = listening_socket(path)
    dead.close()  # the file stays, nobody answers: a crashed previous run
    srv = ResourceServer(RESOURCE, SOCKET, short_tmp, allocator)
    await srv.start()
    try:
        async with grpc.aio.insecure_channel(f"unix://{path}") as channel:
            options = await pb_grpc.DevicePluginStub(channel).GetDevicePluginOptions(pb.Empty(), timeout=2)
        assert options.get_preferred_allocation_available
    finally:
        await srv.stop()


async def test_live_socket_is_refused_and_left_alone(short_tmp: Path, allocator: ScriptedAllocator) -> None:
    path = short_tmp / SOCKET
    live = listening_socket(path)
    try:
        srv = ResourceServer(RESOURCE, SOCKET, short_tmp, allocator)
        with pytest.raises(SocketInUse, match="another process is serving"):
            await srv.start()
        assert not srv.serving
        assert path.is_socket()
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.connect(str(path))  # still the other process's socket
        client.close()
    finally:
        live.close()


async def test_a_file_that_is_no_socket_is_refused(short_tmp: Path, allocator: ScriptedAllocator) -> None:
    (short_tmp / SOCKET).write_text("not mine")
    with pytest.raises(SocketInUse, match="not a socket"):
        await ResourceServer(RESOURCE, SOCKET, short_tmp, allocator).start()
    assert (short_tmp / SOCKET).read_text() == "not mine"


async def test_stop_leaves_a_socket_somebody_else_bound(server: ResourceServer) -> None:
    server.socket_path.unlink()  # the kubelet wiped the folder ...
    other = listening_socket(server.socket_path)  # ... and somebody else took the name
    try:
        assert not server.socket_present()
        await server.stop(grace=0)
        assert server.socket_path.is_socket()
    finally:
        other.close()


async def test_restart_serves_again_after_the_socket_was_removed(server: ResourceServer) -> None:
    server.publish(snapshot(Health.HEALTHY))
    server.socket_path.unlink()
    assert not server.socket_present()
    await server.restart()
    assert server.socket_present()
    async with grpc.aio.insecure_channel(f"unix://{server.socket_path}") as channel:
        call = pb_grpc.DevicePluginStub(channel).ListAndWatch(pb.Empty())
        first = await asyncio.wait_for(call.read(), 2)
        call.cancel()
    assert [d.ID for d in first.devices] == ["fpga-0"]  # the state survives the restart


# -- options ---------------------------------------------------------------------------------


async def test_options_offer_preferred_allocation_and_need_no_pre_start(short_tmp: Path) -> None:
    srv = ResourceServer(RESOURCE, SOCKET, short_tmp, ScriptedAllocator())
    await srv.start()
    try:
        async with grpc.aio.insecure_channel(f"unix://{srv.socket_path}") as channel:
            options = await pb_grpc.DevicePluginStub(channel).GetDevicePluginOptions(pb.Empty(), timeout=2)
    finally:
        await srv.stop()
    assert options.pre_start_required is False  # preparation happens in Allocate
    assert options.get_preferred_allocation_available is True


# -- ListAndWatch ----------------------------------------------------------------------------


async def test_first_message_is_the_full_list_then_every_change(server: ResourceServer, stub: pb_grpc.DevicePluginStub) -> None:
    server.publish(snapshot(Health.HEALTHY, Health.HEALTHY, numa=[[0], [0, 1]]))
    call = stub.ListAndWatch(pb.Empty())
    first = await asyncio.wait_for(call.read(), 2)
    assert [(d.ID, d.health, [n.ID for n in d.topology.nodes]) for d in first.devices] == [
        ("fpga-0", "Healthy", [0]),
        ("fpga-1", "Healthy", [0, 1]),
    ]
    server.publish(snapshot(Health.HEALTHY, Health.UNHEALTHY, numa=[[0], [0, 1]]))
    second = await asyncio.wait_for(call.read(), 2)
    assert [(d.ID, d.health) for d in second.devices] == [("fpga-0", "Healthy"), ("fpga-1", "Unhealthy")]
    call.cancel()


async def test_unknown_topology_sends_no_topology_field(server: ResourceServer, stub: pb_grpc.DevicePluginStub) -> None:
    server.publish(snapshot(Health.HEALTHY))
    call = stub.ListAndWatch(pb.Empty())
    first = await asyncio.wait_for(call.read(), 2)
    assert not first.devices[0].HasField("topology")
    call.cancel()


async def test_stream_waits_for_the_first_list(server: ResourceServer, stub: pb_grpc.DevicePluginStub) -> None:
    call = stub.ListAndWatch(pb.Empty())
    await eventually(lambda: server.stream_count == 1)
    server.publish(snapshot(Health.HEALTHY))
    first = await asyncio.wait_for(call.read(), 2)
    assert [d.ID for d in first.devices] == ["fpga-0"]
    call.cancel()


async def test_a_burst_coalesces_into_the_newest_list(server: ResourceServer, stub: pb_grpc.DevicePluginStub) -> None:
    server.publish(snapshot(Health.HEALTHY))
    call = stub.ListAndWatch(pb.Empty())
    await asyncio.wait_for(call.read(), 2)
    # No await in between: the stream's one-slot queue only ever holds the newest list.
    server.publish(snapshot(Health.HEALTHY, Health.HEALTHY))
    server.publish(snapshot(Health.HEALTHY, Health.HEALTHY, Health.HEALTHY))
    server.publish(snapshot(Health.UNHEALTHY, Health.HEALTHY, Health.HEALTHY, Health.HEALTHY))
    newest = await asyncio.wait_for(call.read(), 2)
    assert [d.ID for d in newest.devices] == ["fpga-0", "fpga-1", "fpga-2", "fpga-3"]
    assert newest.devices[0].health == "Unhealthy"
    call.cancel()


async def test_an_unchanged_list_is_not_sent_again(server: ResourceServer, stub: pb_grpc.DevicePluginStub) -> None:
    server.publish(snapshot(Health.HEALTHY))
    call = stub.ListAndWatch(pb.Empty())
    await asyncio.wait_for(call.read(), 2)
    server.publish(snapshot(Health.HEALTHY))  # equal: nothing to say
    server_side_queues = list(server._streams)
    assert all(q.empty() for q in server_side_queues)
    server.publish(snapshot(Health.UNHEALTHY))
    assert (await asyncio.wait_for(call.read(), 2)).devices[0].health == "Unhealthy"
    call.cancel()


async def test_several_streams_each_get_every_list(server: ResourceServer, stub: pb_grpc.DevicePluginStub) -> None:
    server.publish(snapshot(Health.HEALTHY))
    calls = [stub.ListAndWatch(pb.Empty()) for _ in range(3)]
    for call in calls:
        assert len((await asyncio.wait_for(call.read(), 2)).devices) == 1
    assert server.stream_count == 3
    server.publish(snapshot(Health.HEALTHY, Health.HEALTHY))
    for call in calls:
        assert len((await asyncio.wait_for(call.read(), 2)).devices) == 2
    calls[0].cancel()
    await eventually(lambda: server.stream_count == 2)
    server.publish(snapshot(Health.UNHEALTHY, Health.HEALTHY))
    for call in calls[1:]:
        assert (await asyncio.wait_for(call.read(), 2)).devices[0].health == "Unhealthy"
        call.cancel()


async def test_stream_ends_cleanly_when_the_kubelet_cancels(server: ResourceServer, stub: pb_grpc.DevicePluginStub) -> None:
    server.publish(snapshot(Health.HEALTHY))
    call = stub.ListAndWatch(pb.Empty())
    await asyncio.wait_for(call.read(), 2)
    assert server.stream_count == 1
    call.cancel()
    await eventually(lambda: server.stream_count == 0)
    server.publish(snapshot(Health.UNHEALTHY))  # nobody left to tell: no error


async def test_end_streams_finishes_them_with_ok(server: ResourceServer, stub: pb_grpc.DevicePluginStub) -> None:
    server.publish(snapshot(Health.HEALTHY))
    call = stub.ListAndWatch(pb.Empty())
    await asyncio.wait_for(call.read(), 2)
    server.end_streams()
    assert await asyncio.wait_for(call.read(), 2) is grpc.aio.EOF
    assert await call.code() == grpc.StatusCode.OK
    assert server.stream_count == 0


# -- Allocate, GetPreferredAllocation, PreStartContainer --------------------------------------


async def test_allocate_converts_every_part(
    server: ResourceServer, stub: pb_grpc.DevicePluginStub, allocator: ScriptedAllocator
) -> None:
    request = pb.AllocateRequest(
        container_requests=[
            pb.ContainerAllocateRequest(devices_ids=["fpga-0", "fpga-1"]),
            pb.ContainerAllocateRequest(devices_ids=["fpga-2"]),
        ]
    )
    response = await stub.Allocate(request, timeout=2)
    assert allocator.allocate_calls == [[["fpga-0", "fpga-1"], ["fpga-2"]]]
    assert len(response.container_responses) == 2
    first = response.container_responses[0]
    assert dict(first.envs) == {"FPGA_IDS": "fpga-0,fpga-1"}
    assert [(d.container_path, d.host_path, d.permissions) for d in first.devices] == [
        ("/dev/fpga-0", "/host/dev/fpga-0", "rw"),
        ("/dev/fpga-1", "/host/dev/fpga-1", "rw"),
        ("/dev/ctl", "/dev/ctl", "rw"),  # no host path: the same path on the host
    ]
    assert [(m.container_path, m.host_path, m.read_only) for m in first.mounts] == [("/usr/lib/fpga", "/opt/lib", True)]
    assert [c.name for c in first.cdi_devices] == ["example.com/fpga=fpga-0", "example.com/fpga=fpga-1"]
    assert dict(first.annotations) == {"cdi.k8s.io/cdiplug_x": "example.com/fpga=fpga-0"}
    assert [c.name for c in response.container_responses[1].cdi_devices] == ["example.com/fpga=fpga-2"]


ERRORS = [
    (InvalidRequest("unknown device IDs 'fpga-9'"), grpc.StatusCode.INVALID_ARGUMENT),
    (DeviceUnavailable("fpga-1 is gone"), grpc.StatusCode.FAILED_PRECONDITION),
    (PreparationError("fpga-1", "vfio-pci refused"), grpc.StatusCode.FAILED_PRECONDITION),
    (DeviceInUse("fpga-1", "interface eth3 is up"), grpc.StatusCode.FAILED_PRECONDITION),
    (CdiError("cannot write CDI spec"), grpc.StatusCode.INTERNAL),
    (CdiplugError("something of ours"), grpc.StatusCode.INTERNAL),
]


@pytest.mark.parametrize(("error", "code"), ERRORS, ids=[type(e).__name__ for e, _ in ERRORS])
async def test_allocate_errors_map_to_status_codes(
    server: ResourceServer, stub: pb_grpc.DevicePluginStub, allocator: ScriptedAllocator, error: Exception, code: grpc.StatusCode
) -> None:
    allocator.error = error
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.Allocate(
            pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=["fpga-1"])]), timeout=2
        )
    assert info.value.code() == code
    assert info.value.details() == str(error)


async def test_a_bug_is_internal_and_logged(
    server: ResourceServer, stub: pb_grpc.DevicePluginStub, allocator: ScriptedAllocator, caplog: pytest.LogCaptureFixture
) -> None:
    allocator.error = ZeroDivisionError("oops")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.Allocate(
            pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=["fpga-1"])]), timeout=2
        )
    assert info.value.code() == grpc.StatusCode.INTERNAL
    assert "ZeroDivisionError: oops" in info.value.details()
    assert any(r.exc_info and "Allocate" in r.getMessage() for r in caplog.records)


async def test_preferred_allocation_converts_both_ways(
    server: ResourceServer, stub: pb_grpc.DevicePluginStub, allocator: ScriptedAllocator
) -> None:
    request = pb.PreferredAllocationRequest(
        container_requests=[
            pb.ContainerPreferredAllocationRequest(
                available_deviceIDs=["fpga-0", "fpga-1", "fpga-2"], must_include_deviceIDs=["fpga-2"], allocation_size=2
            )
        ]
    )
    response = await stub.GetPreferredAllocation(request, timeout=2)
    assert allocator.preferred_calls == [
        [PreferredRequest(available=("fpga-0", "fpga-1", "fpga-2"), must_include=("fpga-2",), size=2)]
    ]
    assert [list(r.deviceIDs) for r in response.container_responses] == [["fpga-2", "fpga-0"]]


async def test_preferred_allocation_errors_are_mapped(
    server: ResourceServer, stub: pb_grpc.DevicePluginStub, allocator: ScriptedAllocator
) -> None:
    allocator.error = InvalidRequest("allocation_size 5 but only 3 available")
    request = pb.PreferredAllocationRequest(
        container_requests=[pb.ContainerPreferredAllocationRequest(available_deviceIDs=["a", "b", "c"], allocation_size=5)]
    )
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.GetPreferredAllocation(request, timeout=2)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_pre_start_is_answered_empty_and_touches_no_allocator(
    server: ResourceServer, stub: pb_grpc.DevicePluginStub, allocator: ScriptedAllocator
) -> None:
    allocator.error = PreparationError("fpga-0", "must not be reached")
    answer = await stub.PreStartContainer(pb.PreStartContainerRequest(devices_ids=["fpga-0"]), timeout=2)
    assert answer == pb.PreStartContainerResponse()
    assert allocator.allocate_calls == [] and allocator.preferred_calls == []


async def test_allocator_can_be_replaced_while_serving(server: ResourceServer, stub: pb_grpc.DevicePluginStub) -> None:
    replacement = ScriptedAllocator()
    server.allocator = replacement
    await stub.Allocate(pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=["fpga-0"])]), timeout=2)
    assert replacement.allocate_calls == [[["fpga-0"]]]
