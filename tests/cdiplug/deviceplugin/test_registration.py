"""cdiplug.deviceplugin.registration: the Register call to the kubelet and waiting for a missing or silent one.

Real gRPC over unix sockets in a short temporary folder: the kubelet side is a minimal Registration
servicer defined here that records requests or refuses them, and a plain listening socket that
never speaks HTTP/2 plays a silent kubelet.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from cdiplug.api import deviceplugin_v1beta1_pb2 as pb
from cdiplug.api import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from cdiplug.deviceplugin.registration import KubeletNotReady, Registration, register, register_once
from cdiplug.errors import KubeletError

REG = Registration(resource_name="example.com/fpga", endpoint="example.com-fpga.sock")


class RecordingKubelet(pb_grpc.RegistrationServicer):
    def __init__(self, refuse: str | None = None) -> None:
        self.requests: list[pb.RegisterRequest] = []
        self.refuse = refuse
        self.registered = asyncio.Event()

    async def Register(self, request: pb.RegisterRequest, context: grpc.aio.ServicerContext) -> pb.Empty:
        self.requests.append(request)
        if self.refuse:
            await context.abort(grpc.StatusCode.UNKNOWN, self.refuse)
        self.registered.set()
        return pb.Empty()


async def serve_kubelet(folder: Path, servicer: RecordingKubelet) -> grpc.aio.Server:
    server = grpc.aio.server()
    pb_grpc.add_RegistrationServicer_to_server(servicer, server)
    server.add_insecure_port(f"unix:{folder / 'kubelet.sock'}")
    await server.start()
    return server


@pytest.fixture
async def kubelet(short_tmp: Path) -> AsyncIterator[RecordingKubelet]:
    servicer = RecordingKubelet()
    server = await serve_kubelet(short_tmp, servicer)
    try:
        yield servicer
    finally:
        await server.stop(None)


async def test_register_sends_version_endpoint_name_and_options(short_tmp: Path, kubelet: RecordingKubelet) -> None:
    await register_once(short_tmp / "kubelet.sock", REG)
    [request] = kubelet.requests
    assert request.version == "v1beta1"
    assert request.endpoint == "example.com-fpga.sock"  # a file name, not a path
    assert request.resource_name == "example.com/fpga"
    assert request.options.pre_start_required is False  # preparation is Allocate's
    assert request.options.get_preferred_allocation_available is True


async def test_missing_kubelet_is_not_ready(short_tmp: Path) -> None:
    with pytest.raises(KubeletNotReady, match="no kubelet socket"):
        await register_once(short_tmp / "kubelet.sock", REG)


async def test_dead_socket_is_not_ready(short_tmp: Path) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(short_tmp / "kubelet.sock"))
    sock.close()  # the file stays; nobody listens
    with pytest.raises(KubeletNotReady, match="UNAVAILABLE"):
        await register_once(short_tmp / "kubelet.sock", REG, timeout=1.0)


async def test_silent_kubelet_times_out(short_tmp: Path) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(short_tmp / "kubelet.sock"))
    sock.listen()  # accepts connections, never speaks
    try:
        started = time.monotonic()
        with pytest.raises(KubeletNotReady):
            await register_once(short_tmp / "kubelet.sock", REG, timeout=0.3)
        assert time.monotonic() - started < 2.0
    finally:
        sock.close()


async def test_refusal_is_a_kubelet_error_with_the_reason(short_tmp: Path) -> None:
    servicer = RecordingKubelet(refuse="the ResourceName 'example.com/fpga' is invalid")
    server = await serve_kubelet(short_tmp, servicer)
    try:
        with pytest.raises(KubeletError) as info:
            await register_once(short_tmp / "kubelet.sock", REG)
    finally:
        await server.stop(None)
    assert not isinstance(info.value, KubeletNotReady)
    assert "refused example.com/fpga" in str(info.value)
    assert "is invalid" in str(info.value)
    assert isinstance(info.value.__cause__, grpc.aio.AioRpcError)


async def test_register_waits_for_a_kubelet_that_comes_later(short_tmp: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="cdiplug.deviceplugin.registration")
    task = asyncio.create_task(register(short_tmp / "kubelet.sock", REG, initial_backoff=0.01, max_backoff=0.05))
    # Let it fail a few times against the missing socket; it must neither raise nor finish.
    await asyncio.sleep(0.2)
    assert not task.done()
    servicer = RecordingKubelet()
    server = await serve_kubelet(short_tmp, servicer)
    try:
        attempts = await asyncio.wait_for(task, 5)
    finally:
        await server.stop(None)
    assert attempts > 1
    assert len(servicer.requests) == 1
    waiting = [r for r in caplog.records if "waiting for the kubelet" in r.getMessage()]
    assert len(waiting) == 1  # said once, not once per attempt
    assert waiting[0].resource == "example.com/fpga"
    assert any("registered example.com/fpga" in r.getMessage() for r in caplog.records)


async def test_asked_is_set_once_the_first_attempt_ended_answered_or_not(short_tmp: Path) -> None:
    # What the first CDI spec of a resource waits for: no kubelet at all must not hold it back.
    asked = asyncio.Event()
    task = asyncio.create_task(register(short_tmp / "kubelet.sock", REG, initial_backoff=5, max_backoff=5, asked=asked))
    try:
        await asyncio.wait_for(asked.wait(), 5)  # the missing socket: failed at once, and retried later
        assert not task.done()
    finally:
        task.cancel()
    servicer = RecordingKubelet()
    server = await serve_kubelet(short_tmp, servicer)
    try:
        answered = asyncio.Event()
        task = asyncio.create_task(register(short_tmp / "kubelet.sock", REG, asked=answered))
        await asyncio.wait_for(answered.wait(), 5)
        assert len(servicer.requests) == 1  # set after the kubelet had the call
        await asyncio.wait_for(task, 5)
    finally:
        await server.stop(None)


async def test_register_retries_a_refusal_and_logs_it_once(short_tmp: Path, caplog: pytest.LogCaptureFixture) -> None:
    servicer = RecordingKubelet(refuse="requested API version is not supported")
    server = await serve_kubelet(short_tmp, servicer)
    try:
        task = asyncio.create_task(register(short_tmp / "kubelet.sock", REG, initial_backoff=0.01, max_backoff=0.02))
        deadline = time.monotonic() + 5
        while len(servicer.requests) < 3:  # three refusals seen by the kubelet
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        servicer.refuse = None
        assert await asyncio.wait_for(task, 5) >= 4
    finally:
        await server.stop(None)
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "not supported" in errors[0].getMessage()


async def test_register_can_be_cancelled_while_waiting(short_tmp: Path) -> None:
    task = asyncio.create_task(register(short_tmp / "kubelet.sock", REG, initial_backoff=0.01))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_backoff_is_capped(short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sleeps: list[float] = []
    real_sleep = asyncio.sleep

    async def recording_sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) >= 12:
            raise asyncio.CancelledError
        await real_sleep(0)

    monkeypatch.setattr("cdiplug.toolkit.backoff.asyncio.sleep", recording_sleep)
    with pytest.raises(asyncio.CancelledError):
        await register(short_tmp / "kubelet.sock", REG, initial_backoff=0.05, max_backoff=2.0)
    assert 0.04 <= sleeps[0] <= 0.06  # starts at about 50 ms (with jitter)
    assert sleeps == sorted(sleeps[:6]) + sleeps[6:]  # grows ...
    assert max(sleeps) <= 2.0 * 1.2  # ... up to about 2 s
    assert min(sleeps[-3:]) >= 2.0 * 0.8
