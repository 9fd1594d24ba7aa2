"""The metrics endpoint against slow, silent, greedy and junk clients (issue #12, item 6).

Real TCP on 127.0.0.1 port 0, raw sockets on the client side. Covers: a silent and a trickling
client dropped after the timeout (a short one here; 10 s by default), the 65th concurrent
connection closed at once while 64 are held, 431 for headers over 8 KiB, 400/405/404 for junk, a
wrong method and an unknown path, no thread per connection, no file descriptor left behind, and
the endpoint answering normally again afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
from collections.abc import AsyncIterator

import pytest

from cdiplug.metrics import Metrics
from cdiplug.metrics_http import MAX_CONNECTIONS, MAX_HEADER_BYTES, REQUEST_TIMEOUT, MetricsServer


@contextlib.asynccontextmanager
async def serving(timeout: float = 0.5) -> AsyncIterator[MetricsServer]:
    async with MetricsServer(Metrics(), "127.0.0.1", 0, timeout=timeout) as server:
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
    assert (REQUEST_TIMEOUT, MAX_CONNECTIONS, MAX_HEADER_BYTES) == (10.0, 64, 8192)


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
        assert await asyncio.wait_for(reader.read(), 10) == b""
        writer.close()
        assert server.stats["timed_out"] == 2 and server.connections == 0


async def test_connections_are_bounded_and_cost_no_thread_each() -> None:
    fds, threads = open_fds(), threading.active_count()
    async with serving(timeout=30) as server:
        held = []
        for _ in range(MAX_CONNECTIONS):
            sock = socket.create_connection(("127.0.0.1", server.port))
            sock.sendall(b"GET /metrics HTTP/1.1\r\n")  # never finished
            held.append(sock)
        await asyncio.to_thread(lambda: None)
        async with asyncio.timeout(10):
            while server.connections < MAX_CONNECTIONS:  # accepted on the server's own loop: look
                await asyncio.sleep(0.01)
        assert threading.active_count() <= threads + 2  # the server's one thread (+ to_thread's worker)
        extra = await exchange(server, b"GET /healthz HTTP/1.1\r\n\r\n")
        assert extra == b"" and server.stats["refused"] >= 1  # closed at once, not queued
        for sock in held:
            sock.close()
        async with asyncio.timeout(10):
            while server.connections:
                await asyncio.sleep(0.01)
        assert (await exchange(server, b"GET /healthz HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.0 200")
    assert open_fds() <= fds + 1  # the default executor's wake-up pipe may stay
