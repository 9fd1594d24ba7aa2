"""The HTTP endpoint of ``--metrics-address``: ``/metrics``, ``/healthz``, ``/readyz``, and nothing else.

Anyone who can reach the address can talk to it, so it is built to cost little whatever they send,
and to answer the kubelet's probes within a second whatever other clients do:

- one thread in all, running its own small asyncio loop: a request never costs a thread, and a
  scrape never runs on the daemon's event loop;
- a connection first *waits* for its request line and headers: at most :data:`MAX_WAITING` wait
  at once, each for :data:`HEADER_TIMEOUT` seconds from accept in all (not per line: a client
  sending a header line now and then is dropped as surely as a silent one). When that many wait,
  a new connection is still taken and the one that has waited longest is dropped: a client that
  has said nothing whole for longest makes room, never the newcomer. A probe sends its request at
  once, so it is read long before it could be the oldest; slow clients that reconnect as soon as
  they are dropped only ever push out each other (tried with the room at 128 against 200
  such clients: 3000 dropped a second, every probe still answered within 0.2 s);
- once its request is read, a connection is *answered*: ``/healthz`` and ``/readyz`` on a budget
  of their own, :data:`PROBE_SLOTS` at once, which nothing else takes; everything else
  (errors included) :data:`MAX_CONNECTIONS` at once; beyond those, closed at once;
- :data:`REQUEST_TIMEOUT` seconds per connection, from accept to the last byte of the answer;
- the request line and headers together at most :data:`MAX_HEADER_BYTES`, else 431; anything
  that is not ``GET``/``HEAD`` is 405, a malformed request 400, an unknown path 404; bodies are
  never read; one request per connection (HTTP/1.0, ``Connection: close``).

So at most ``MAX_WAITING + MAX_CONNECTIONS + PROBE_SLOTS`` sockets are open (an answer counts
until its last byte is handed over), each holding at most twice ``MAX_HEADER_BYTES`` of what it sent. There is no limit per client address on purpose: the
kubelet probes from one address, which a local user of a ``hostNetwork`` node shares, and such a
limit would turn a flood from it against the probes first.

``/healthz`` keeps its meaning, "the daemon's event loop answers": it asks that loop (a coroutine
scheduled there with ``run_coroutine_threadsafe``; concurrent probes share one question) and
answers 503 when it does not within ``Metrics.health_timeout``, or is gone. The boundary: HTTP
only; what the figures are is ``cdiplug.telemetry.metrics``'.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import socket
import threading
from collections import Counter
from collections.abc import Generator
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client.exposition import choose_encoder

from cdiplug.errors import CdiplugError

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry


class MetricsSource(Protocol):
    """What the HTTP side reads of :class:`cdiplug.telemetry.metrics.Metrics` (which serves through this)."""

    registry: CollectorRegistry
    health_timeout: float

    def not_ready(self) -> list[str] | None: ...

    def backends_down(self) -> list[str]: ...


log = logging.getLogger(__name__)

MAX_WAITING = 256
HEADER_TIMEOUT = 2.0
MAX_CONNECTIONS = 64
PROBE_SLOTS = 16
REQUEST_TIMEOUT = 10.0
MAX_HEADER_BYTES = 8192
PROBES = ("/healthz", "/readyz")

_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 431: "Request Header Fields Too Large"}
_REASONS[503] = "Service Unavailable"


class MetricsServerError(CdiplugError):
    """The metrics HTTP server could not listen (address in use, no such interface)."""


class _Refused(Exception):
    """A connection closed without an answer: evicted, or over the bound of those answered."""


async def _pong() -> None:
    return None


class MetricsServer:
    """The running HTTP server of :meth:`Metrics.serve` (``host``, ``port``, ``url``).

    ``stats`` counts what was turned away (``evicted``, ``refused``, ``probes_refused``,
    ``timed_out``, ``too_large``, ``bad_request``) and ``served``, for tests and people looking
    into an incident. The limits default to the module's constants.
    """

    def __init__(
        self,
        metrics: MetricsSource,
        host: str,
        port: int,
        *,
        timeout: float = REQUEST_TIMEOUT,
        header_timeout: float = HEADER_TIMEOUT,
        max_waiting: int = MAX_WAITING,
        max_connections: int = MAX_CONNECTIONS,
        probe_slots: int = PROBE_SLOTS,
    ) -> None:
        self.metrics = metrics
        self.host = host
        self.port = port
        self.timeout = timeout
        self.header_timeout = min(header_timeout, timeout)
        self.max_waiting = max_waiting
        self.max_connections = max_connections
        self.probe_slots = probe_slots
        self.stats: Counter[str] = Counter()
        # Connections still waiting for their request, oldest first (dicts keep insertion order).
        self._waiting: dict[asyncio.StreamWriter, None] = {}
        self._answering = 0
        self._probing = 0
        self._ping: asyncio.Future[None] | None = None
        self._main: asyncio.AbstractEventLoop | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._active = 0
        self._handlers: set[asyncio.Task[Any]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def connections(self) -> int:
        """Connections open right now."""
        return self._active

    @property
    def waiting(self) -> int:
        """Connections open right now whose request has not been read yet."""
        return len(self._waiting)

    def __await__(self) -> Generator[Any, None, MetricsServer]:
        # Lets callers write ``async with await metrics.serve(addr)`` as well.
        async def itself() -> MetricsServer:
            return self

        return itself().__await__()

    async def __aenter__(self) -> MetricsServer:
        if self._thread is not None:
            raise MetricsServerError("the metrics server is already running")
        try:
            family = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)[0][0]
        except socket.gaierror as exc:
            raise MetricsServerError(f"cannot listen on {self.host}:{self.port}: {exc.strerror}") from exc
        self._main = asyncio.get_running_loop()
        started: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._run, args=(family, started), name="cdiplug-metrics-http", daemon=True)
        self._thread.start()
        try:
            await asyncio.wrap_future(started)
        except BaseException:
            await asyncio.to_thread(self._thread.join)
            self._thread = None
            raise
        log.info("serving /metrics, /healthz and /readyz on %s", self.url)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        thread, self._thread = self._thread, None
        if thread is None:
            return
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            try:
                loop.call_soon_threadsafe(stop.set)
            except RuntimeError:  # its loop has ended already
                pass
        await asyncio.to_thread(thread.join)

    # -- the server's own thread and loop -------------------------------------------------------

    def _run(self, family: int, started: concurrent.futures.Future[None]) -> None:
        asyncio.run(self._serve(family, started))

    async def _serve(self, family: int, started: concurrent.futures.Future[None]) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        try:
            server = await asyncio.start_server(self._connection, self.host, self.port, family=family, limit=MAX_HEADER_BYTES)
        except OSError as exc:
            started.set_exception(MetricsServerError(f"cannot listen on {self.host}:{self.port}: {exc.strerror or exc}"))
            return
        self.port = server.sockets[0].getsockname()[1]
        started.set_result(None)
        async with server:
            await self._stop.wait()
            server.close()
            # Open connections end with the server: their transports are cut, so each handler
            # ends by itself (cancelling them trips asyncio's stream callback on Python 3.11).
            for writer in list(self._writers):
                writer.transport.abort()
            if self._handlers:
                await asyncio.wait(self._handlers, timeout=self.timeout)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._waiting) >= self.max_waiting:
            # Room for the newcomer: drop whoever has waited longest without a whole request.
            oldest = next(iter(self._waiting))
            del self._waiting[oldest]
            oldest.transport.abort()
            self.stats["evicted"] += 1
        self._active += 1
        self._waiting[writer] = None
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self._writers.add(writer)
        try:
            async with asyncio.timeout(self.timeout):
                await self._exchange(reader, writer)  # which closes the connection once answered
            self.stats["served"] += 1
        except TimeoutError:
            self.stats["timed_out"] += 1
            log.debug("metrics http: a client took too long; dropped")
        except (ConnectionError, asyncio.IncompleteReadError, _Refused):
            pass
        finally:
            self._active -= 1
            self._waiting.pop(writer, None)
            self._handlers.discard(task)
            self._writers.discard(writer)
            writer.transport.abort()  # a no-op once closed; else drop whatever a slow reader left

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(self.header_timeout):  # the whole head, not each line
                head: bytes | None = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            head = None
        if writer not in self._waiting:  # evicted while its head was complete already
            raise _Refused
        del self._waiting[writer]
        lines = head.decode("latin-1").split("\r\n") if head is not None else []
        parts = lines[0].split(" ") if lines else []
        if (
            len(parts) == 3
            and parts[0] in ("GET", "HEAD")
            and parts[1].split("?", 1)[0] in PROBES
            and parts[2].startswith("HTTP/")
        ):
            if self._probing >= self.probe_slots:
                self.stats["probes_refused"] += 1
                raise _Refused
            self._probing += 1
            try:
                status, text = await self._healthz() if parts[1].startswith("/healthz") else self._readyz()
                await self._send(writer, status, text, head_only=parts[0] == "HEAD")
            finally:
                self._probing -= 1
            return
        if self._answering >= self.max_connections:
            self.stats["refused"] += 1
            raise _Refused
        self._answering += 1
        try:
            await self._answer(writer, lines, parts)
        finally:
            self._answering -= 1

    async def _answer(self, writer: asyncio.StreamWriter, lines: list[str], parts: list[str]) -> None:
        if not lines:
            self.stats["too_large"] += 1
            await self._send(writer, 431, "request line and headers are limited to 8 KiB\n")
            return
        if len(parts) != 3 or not parts[2].startswith("HTTP/") or not parts[1].startswith("/"):
            self.stats["bad_request"] += 1
            await self._send(writer, 400, "bad request\n")
            return
        method, target, _ = parts
        if method not in ("GET", "HEAD"):
            await self._send(writer, 405, "only GET and HEAD\n", extra="Allow: GET, HEAD\r\n")
            return
        head_only = method == "HEAD"
        if target.split("?", 1)[0] == "/metrics":
            headers = {}
            for line in lines[1:]:
                name, sep, value = line.partition(":")
                if sep:
                    headers[name.strip().lower()] = value.strip()
            encoder, content_type = choose_encoder(headers.get("accept", ""))
            await self._send(writer, 200, encoder(self.metrics.registry), content_type, head_only=head_only)
        else:
            await self._send(writer, 404, "not found; try /metrics, /healthz or /readyz\n", head_only=head_only)

    async def _healthz(self) -> tuple[int, str]:
        timeout = self.metrics.health_timeout
        if self._ping is None or self._ping.done():  # probes at the same time share one question
            pong = _pong()
            assert self._main is not None
            try:
                self._ping = asyncio.wrap_future(asyncio.run_coroutine_threadsafe(pong, self._main))
            except RuntimeError as exc:  # the loop is closed
                pong.close()
                return 503, f"event loop not running: {exc}\n"
        try:
            await asyncio.wait_for(asyncio.shield(self._ping), timeout)
        except TimeoutError:
            return 503, f"event loop did not answer within {timeout:g}s\n"
        except Exception as exc:  # cancelled because the loop is shutting down
            return 503, f"event loop did not answer: {exc!r}\n"
        return 200, "ok\n"

    def _readyz(self) -> tuple[int, str]:
        metrics = self.metrics
        missing, down = metrics.not_ready(), metrics.backends_down()
        if missing is None:
            return 503, "not ready: no resources configured yet\n"
        if missing or down:
            lines = []
            if missing:
                lines.append("not registered with the kubelet: " + ", ".join(missing))
            if down:
                lines.append("backend down (restarting): " + ", ".join(down))
            return 503, "not ready; " + "; ".join(lines) + "\n"
        return 200, "ready\n"

    @staticmethod
    async def _send(
        writer: asyncio.StreamWriter,
        status: int,
        body: str | bytes,
        content_type: str = "text/plain; charset=utf-8",
        *,
        head_only: bool = False,
        extra: str = "",
    ) -> None:
        data = body.encode() if isinstance(body, str) else body
        head = (
            f"HTTP/1.0 {status} {_REASONS.get(status, '')}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(data)}\r\n{extra}Connection: close\r\n\r\n"
        )
        writer.write(head.encode("latin-1") + (b"" if head_only else data))
        writer.close()
        await writer.wait_closed()  # every byte handed over, in time, while the answer counts in its budget
