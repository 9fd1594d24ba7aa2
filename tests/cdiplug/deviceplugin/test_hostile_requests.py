"""Hostile gRPC requests against a real ResourceServer with the real Allocator.

Real grpc.aio over a unix socket; some requests are raw bytes sent without protobuf on our side
(IDs that are not valid UTF-8, truncated messages). Covers: status codes (INVALID_ARGUMENT, never
RESOURCE_EXHAUSTED or INTERNAL, for 10,000 unknown IDs, a 1 MiB ID, undecodable requests, the same
device in two containers, GetPreferredAllocation with IDs we do not advertise or sizes that cannot
be met), status details that stay short, and log lines that never carry a whole request.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from cdiplug.api import deviceplugin_v1beta1_pb2 as pb
from cdiplug.api import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from cdiplug.backend import Abilities
from cdiplug.deviceplugin.allocator import Allocator
from cdiplug.deviceplugin.server import MAX_DETAILS, ResourceServer, Undecodable
from cdiplug.deviceplugin.settings import DevicePluginSettings
from cdiplug.models.devices import Device, DeviceSnapshot
from cdiplug.models.resource import ResourceConfig
from cdiplug.toolkit.brief import brief, format_ids

RESOURCE = "example.com/fpga"
SOCKET = "example.com-fpga.sock"
BIG = 1 << 20


def field(number: int, payload: bytes) -> bytes:
    """One length-delimited protobuf field (wire type 2), encoded by hand."""
    length, size = b"", len(payload)
    while True:
        byte, size = size & 0x7F, size >> 7
        length += bytes([byte | (0x80 if size else 0)])
        if not size:
            break
    return bytes([(number << 3) | 2]) + length + payload


@pytest.fixture
async def stub(short_tmp: Path) -> AsyncIterator[tuple[pb_grpc.DevicePluginStub, grpc.aio.Channel]]:
    config = ResourceConfig(name=RESOURCE, backend="fake", options=None, settings=DevicePluginSettings(replicas=2))
    allocator = Allocator(config, Abilities())
    allocator.update(DeviceSnapshot(RESOURCE, [Device(f"fpga-{i}", numa_nodes=(i % 2,)) for i in range(4)]))
    server = ResourceServer(RESOURCE, SOCKET, short_tmp, allocator)
    await server.start()
    options = [("grpc.max_send_message_length", 8 * BIG)]
    try:
        async with grpc.aio.insecure_channel(f"unix://{server.socket_path}", options=options) as channel:
            yield pb_grpc.DevicePluginStub(channel), channel
    finally:
        await server.stop()


def allocate_request(*containers: list[str]) -> pb.AllocateRequest:
    return pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids) for ids in containers])


async def rejected(call, request) -> grpc.aio.AioRpcError:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call(request, timeout=10)
    return info.value


def test_format_ids_names_a_few_and_counts_the_rest() -> None:
    assert format_ids(["a", "b", "a"]) == "'a', 'b'"
    assert format_ids([f"x{i}" for i in range(10_000)]) == "'x0', 'x1', 'x2', … and 9,997 more"
    long = format_ids(["y" * BIG])
    assert len(long) < 120 and "1,048,576 chars" in long
    assert brief(b"\xff" * 100).endswith("(100 bytes)")


async def test_ten_thousand_unknown_ids_are_invalid_argument_with_a_short_message(stub, caplog) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.DEBUG)
    error = await rejected(stub[0].Allocate, allocate_request([f"nope-{i}" for i in range(10_000)]))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "'nope-0', 'nope-1', 'nope-2', … and 9,997 more" in error.details()
    assert len(error.details()) < 300
    assert max(len(r.getMessage()) for r in caplog.records) < 1000


async def test_a_one_mebibyte_id_never_makes_a_long_message_or_log_line(stub, caplog) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.DEBUG)
    error = await rejected(stub[0].Allocate, allocate_request(["z" * BIG, "fpga-0::0"]))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "1,048,576 chars" in error.details() and len(error.details()) < MAX_DETAILS
    assert all(len(r.getMessage()) < 1000 for r in caplog.records)


async def test_ids_that_are_not_utf8_are_invalid_argument_naming_the_field(stub) -> None:  # type: ignore[no-untyped-def]
    _, channel = stub
    raw = channel.unary_unary("/v1beta1.DevicePlugin/Allocate")  # bytes in, bytes out
    good = field(1, field(1, b"fpga-0::0"))
    bad = field(1, field(1, b"fpga-0::1") + field(1, b"fpga-\xff\xfe"))
    error = await rejected(raw, good + bad)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "container_requests[1].devices_ids[1] is not valid UTF-8" in error.details()
    assert "fpga-\\xff\\xfe" in error.details()
    # The same service still answers a good request afterwards.
    assert await raw(good, timeout=10)
    preferred = channel.unary_unary("/v1beta1.DevicePlugin/GetPreferredAllocation")
    error = await rejected(preferred, field(1, field(2, b"\xc3\x28")))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "must_include_deviceIDs[0] is not valid UTF-8" in error.details()
    pre_start = channel.unary_unary("/v1beta1.DevicePlugin/PreStartContainer")
    error = await rejected(pre_start, field(1, b"\xed\xa0\x80" * (BIG // 3)))  # a surrogate, a megabyte of them
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and len(error.details()) < MAX_DETAILS


async def test_a_message_that_is_no_protobuf_at_all_is_invalid_argument(stub) -> None:  # type: ignore[no-untyped-def]
    raw = stub[1].unary_unary("/v1beta1.DevicePlugin/Allocate")
    error = await rejected(raw, b"\x0a\xff\xff\xff\xff\x0f")  # a length far past the end
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "cannot parse AllocateRequest (6 bytes)" in error.details()
    assert Undecodable(pb.AllocateRequest, b"\x0a").reason.endswith("not a valid protobuf message")


async def test_the_same_device_in_two_containers_is_invalid_argument(stub) -> None:  # type: ignore[no-untyped-def]
    error = await rejected(stub[0].Allocate, allocate_request(["fpga-0::0"], ["fpga-1::0", "fpga-0::0"]))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "in more than one container request (first in requests 0 and 1): 'fpga-0::0'" in error.details()
    # Two replicas of one device in two containers is sharing, which replicas are for.
    response = await stub[0].Allocate(allocate_request(["fpga-0::0"], ["fpga-0::1"]), timeout=10)
    assert len(response.container_responses) == 2


def preferred_request(available: list[str], must: list[str], size: int) -> pb.PreferredAllocationRequest:
    return pb.PreferredAllocationRequest(
        container_requests=[
            pb.ContainerPreferredAllocationRequest(
                available_deviceIDs=available, must_include_deviceIDs=must, allocation_size=size
            )
        ]
    )


@pytest.mark.parametrize(
    ("available", "must", "size", "why"),
    [
        (["fpga-0::0", "ghost"], [], 1, "device IDs not advertised 'ghost'"),
        (["fpga-0::0"], ["fpga-9::0"], 1, "device IDs not advertised 'fpga-9::0'"),
        (["fpga-0::0", "fpga-1::0"], [], 3, "allocation size 3 cannot be met with 2 devices offered, 0 of them required"),
        (["fpga-0::0", "fpga-1::0"], ["fpga-0::0", "fpga-1::0"], 1, "size 1 cannot be met with 2 devices offered, 2 of them"),
        (["fpga-0::0"], [], 0, "size 0 cannot be met"),
        (["fpga-0::0"], [], -5, "size -5 cannot be met"),
    ],
)
async def test_preferred_allocation_that_cannot_be_answered_is_invalid_argument(stub, available, must, size, why) -> None:  # type: ignore[no-untyped-def]
    error = await rejected(stub[0].GetPreferredAllocation, preferred_request(available, must, size))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert why in error.details()


async def test_preferred_allocation_with_good_requests_still_answers(stub) -> None:  # type: ignore[no-untyped-def]
    ids = [f"fpga-{i}::{r}" for i in range(4) for r in range(2)]
    response = await stub[0].GetPreferredAllocation(preferred_request(ids, ["fpga-3::1"], 2), timeout=10)
    assert list(response.container_responses[0].deviceIDs)[0] == "fpga-3::1"
    error = await rejected(stub[0].GetPreferredAllocation, preferred_request([f"g{i}" for i in range(10_000)], [], 1))
    assert "… and 9,997 more" in error.details()
