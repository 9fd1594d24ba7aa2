"""The metrics endpoint against slow, silent, greedy and junk clients.

Real TCP on 127.0.0.1 port 0, raw sockets on the client side. Covers: a silent and a trickling
client dropped after the timeout (a short one here; 10 s by default), the deadline for the
request head being for the whole head (a header line now and then does not extend it), a full
waiting room (256 held) dropping its oldest for a newcomer so that probes are answered, probes
answered while everything else is over its bound and the other way round, 431 for headers over
8 KiB, 400/405/404 for junk, a wrong method and an unknown path, no thread per connection, no
file descriptor left behind, and the endpoint answering normally again afterwards. The attack of
At full size (200 slow clients for 60 s): tests/chaos/test_metrics_probes.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from cdiplug.telemetry.http import (
    HEADER_TIMEOUT,
    MAX_CONNECTIONS,
    MAX_HEADER_BYTES,
    MAX_WAITING,
    PROBE_SLOTS,
    REQUEST_TIMEOUT,
    MetricsServer,
)
from cdiplug.telemetry.metrics import Metrics
from cdiplug.testing.poll import eventually


@contextlib.asynccontextmanager
async def serving(timeout: float = 0.5, **limits: Any) -> AsyncIterator[MetricsServer]:
    async with MetricsServer(Metrics(), "127.0.0.1", 0, timeout=timeout, **limits) as server:
        yield server


async def exchange(server: MetricsServer, data: bytes) -> bytes:
    """Send ``data``, read until the server closes; the bytes it answered (none when it reset)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(data)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 10)
    except ConnectionResetError:
        return b""
    finally:
        writer.close()


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_the_documented_defaults() -> None:
    assert (REQUEST_TIMEOUT, HEADER_TIMEOUT, MAX_WAITING, MAX_CONNECTIONS, PROBE_SLOTS, MAX_HEADER_BYTES) == (
        10.0,
        2.0,
        256,
        64,
        16,
        8192,
    )


async def test_the_endpoints_answer() -> None:
    async with serving() as server:
        assert (await exchange(server, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")).startswith(b"HTTP/1.0 200 OK\r\n")
        metrics = await exchange(server, b"GET /metrics HTTP/1.1\r\n\r\n")
        assert b"process_open_fds" in metrics and b"Connection: close" in metrics
        head = await exchange(server, b"HEAD /readyz HTTP/1.0\r\n\r\n")
        assert head.startswith(b"HTTP/1.0 503") and head.endswith(b"\r\n\r\n")


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"\x00\xff\xfe junk\r\n\r\n", b"400"),
        (b"GET\r\n\r\n", b"400"),
        (b"GET http://elsewhere/ HTTP/1.1\r\n\r\n", b"400"),
        (b"POST /metrics HTTP/1.1\r\nContent-Length: 1000000\r\n\r\n", b"405"),
        (b"GET /../../etc/passwd HTTP/1.1\r\n\r\n", b"404"),
        (b"GET /metrics HTTP/1.1\r\nX: " + b"a" * (MAX_HEADER_BYTES + 1) + b"\r\n\r\n", b"431"),
    ],
)
async def test_junk_is_answered_briefly(request_bytes: bytes, status: bytes) -> None:
    async with serving() as server:
        answer = await exchange(server, request_bytes)
        assert answer.startswith(b"HTTP/1.0 " + status + b" ") and len(answer) < 300


async def test_silent_and_trickling_clients_are_dropped() -> None:
    async with serving(timeout=0.3) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        assert await asyncio.wait_for(reader.read(), 10) == b""  # silent: closed without a word
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        with contextlib.suppress(ConnectionError):
            for byte in b"GET /metrics HTTP/1.1\r\nX-Slow: " + b"s" * 1000:
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(0.01)  # a slow-loris client: one byte at a time, never done
                if reader.at_eof():
                    break
        # dropped without a word: an end of file, or a reset where bytes it sent were still unread
        with contextlib.suppress(ConnectionResetError):
            assert await asyncio.wait_for(reader.read(), 10) == b""
        writer.close()
        assert server.stats["timed_out"] == 2 and server.connections == 0


async def test_a_full_waiting_room_drops_its_oldest_and_probes_are_answered() -> None:
    fds, threads = open_fds(), threading.active_count()
    async with serving(timeout=30, header_timeout=30) as server:
        held: list[socket.socket] = []

        async def hold() -> None:
            sock = socket.create_connection(("127.0.0.1", server.port))
            sock.sendall(b"GET /metrics HTTP/1.1\r\n")  # never finished
            held.append(sock)
            await eventually(lambda: server.waiting == min(len(held), MAX_WAITING))  # taken in this order

        for _ in range(MAX_WAITING):
            await hold()
        assert threading.active_count() <= threads + 2  # the server's one thread (+ to_thread's worker)
        for n in range(1, 4):  # a full room each time: the probe pushes out the oldest; a slow one refills
            probe = b"GET /healthz HTTP/1.1\r\n\r\n" if n % 2 else b"GET /readyz HTTP/1.1\r\n\r\n"
            answer = await exchange(server, probe)
            assert answer.startswith(b"HTTP/1.0 200" if n % 2 else b"HTTP/1.0 503")  # answered (not ready: 503)
            await hold()
            assert server.stats["evicted"] == n and server.connections == MAX_WAITING
        for sock in held[:3]:  # the oldest made room, closed without a word
            sock.settimeout(10)
            assert sock.recv(100) == b""
        held[3].setblocking(False)
        with pytest.raises(BlockingIOError):
            held[3].recv(100)  # the rest still wait
        for sock in held:
            sock.close()
        await eventually(lambda: server.connections == 0)
        assert (await exchange(server, b"GET /metrics HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.0 200")
    assert open_fds() <= fds + 1  # the default executor's wake-up pipe may stay


async def test_the_deadline_for_the_head_is_for_the_whole_head() -> None:
    async with serving(timeout=30, header_timeout=0.5) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET /metrics HTTP/1.1\r\n")
        started = time.monotonic()
        with contextlib.suppress(ConnectionError):
            while not reader.at_eof() and time.monotonic() - started < 20:
                writer.write(b"X-Slow: one header line at a time\r\n")  # each well within the deadline
                await writer.drain()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(reader.read(), 0.1)
        assert reader.at_eof() and time.monotonic() - started < 20  # dropped, not kept alive by the lines
        writer.close()
        assert server.stats["timed_out"] == 1


async def test_probes_and_the_rest_have_budgets_of_their_own() -> None:
    async with serving(max_connections=0) as server:  # everything but the probes over its bound
        assert await exchange(server, b"GET /metrics HTTP/1.1\r\n\r\n") == b"" and server.stats["refused"] == 1
        assert (await exchange(server, b"GET /healthz HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.0 200")
    async with serving(probe_slots=0) as server:  # the probes over theirs: closed at once, the rest served
        assert await exchange(server, b"GET /readyz HTTP/1.1\r\n\r\n") == b"" and server.stats["probes_refused"] == 1
        assert (await exchange(server, b"GET /metrics HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.0 200")
