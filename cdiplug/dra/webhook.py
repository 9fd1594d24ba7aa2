"""The validating admission webhook's HTTPS server: ``POST /validate`` (an AdmissionReview v1),
``GET /healthz``.

One asyncio server with TLS (the certificate and key the chart mounts from a Secret, re-read
when they change on disk: each new connection uses the files as they are). HTTP/1.1 with one
request per connection, the body read up to :data:`MAX_BODY` bytes, :data:`TIMEOUT` seconds per
connection. What to answer is :func:`cdiplug.dra.admission.review`'s; an object none of our
drivers is named in is allowed without looking further, and so is anything the webhook cannot
make sense of (a kind it was not registered for): refusing is for our configuration only.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cdiplug.dra.admission import KINDS, ClassReader, Driver, review

log = logging.getLogger(__name__)

MAX_BODY = 4 << 20  # an AdmissionReview of a claim is a few KiB; the API server's limit is 3 MiB
MAX_HEAD = 16 << 10
TIMEOUT = 10.0


def answer(body: Mapping[str, Any], message: str | None) -> dict[str, Any]:
    """The AdmissionReview response to ``body``: allowed, or refused with ``message``."""
    request = body.get("request") or {}
    response: dict[str, Any] = {"uid": request.get("uid", ""), "allowed": message is None}
    if message is not None:
        response["status"] = {"code": 422, "reason": "Invalid", "message": message}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


async def decide(body: Mapping[str, Any], drivers: Mapping[str, Driver], read_class: ClassReader | None) -> str | None:
    """The refusal message for the AdmissionReview ``body``, or None to allow it."""
    request = body.get("request")
    if not isinstance(request, Mapping):
        return None
    kind = (request.get("kind") or {}).get("kind")
    obj = request.get("object")
    if kind not in KINDS or not isinstance(obj, Mapping) or request.get("operation") not in ("CREATE", "UPDATE"):
        return None
    old = request.get("oldObject")
    if request.get("operation") == "UPDATE" and isinstance(old, Mapping) and old.get("spec") == obj.get("spec"):
        return None  # metadata or status only (a finalizer added): the configuration is as it was admitted
    message = await review(obj, kind, drivers, read_class)
    if message is not None:
        meta = obj.get("metadata") or {}
        log.info("refused %s %s/%s: %s", kind, meta.get("namespace", ""), meta.get("name") or meta.get("generateName"), message)
    return message


class _Certificates:
    """An SSL context for the cert and key files, made again when either file changes."""

    def __init__(self, cert: Path, key: Path) -> None:
        self.cert, self.key = cert, key
        self._stamp: tuple[float, float] | None = None
        self._context: ssl.SSLContext | None = None

    def context(self) -> ssl.SSLContext:
        stamp = (os.stat(self.cert).st_mtime, os.stat(self.key).st_mtime)
        if self._context is None or stamp != self._stamp:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            context.load_cert_chain(self.cert, self.key)
            context.set_alpn_protocols(["http/1.1"])
            self._context, self._stamp = context, stamp
            log.info("TLS certificate loaded from %s", self.cert)
        return self._context


class WebhookServer:
    """``async with WebhookServer(...) as server``: serving on ``server.port`` until the block ends."""

    def __init__(
        self,
        drivers: Mapping[str, Driver],
        cert: Path,
        key: Path,
        host: str = "0.0.0.0",
        port: int = 9443,
        read_class: ClassReader | None = None,
    ) -> None:
        self.drivers = dict(drivers)
        self.read_class = read_class
        self.host, self.port = host, port
        self._certs = _Certificates(Path(cert), Path(key))
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> WebhookServer:
        self._certs.context()  # a bad certificate fails here, before anything is served
        self._server = await asyncio.start_server(self._plain, self.host, self.port, limit=MAX_HEAD)
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("admission webhook serving https on %s:%d for drivers %s", self.host, self.port, ", ".join(sorted(self.drivers)))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _plain(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(TIMEOUT):
                await writer.start_tls(self._certs.context())
                await self._exchange(reader, writer)
        except (TimeoutError, ConnectionError, ssl.SSLError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            log.debug("webhook connection dropped: %s", exc)
        except OSError as exc:
            log.warning("webhook connection failed: %s", exc)
        finally:
            writer.transport.abort()

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        parts = head[0].split(" ")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in head[1:] if line)}
        if len(parts) != 3:
            await self._send(writer, 400, b"bad request\n")
            return
        method, target = parts[0], parts[1].split("?", 1)[0]
        if target == "/healthz" and method == "GET":
            await self._send(writer, 200, b"ok\n")
            return
        if target != "/validate" or method != "POST":
            await self._send(writer, 404, b"not found; POST /validate\n")
            return
        length = int(headers.get("content-length", "-1")) if headers.get("content-length", "").isdigit() else -1
        if not 0 <= length <= MAX_BODY:
            await self._send(writer, 413, b"a body of at most 4 MiB with a Content-Length\n")
            return
        try:
            body = json.loads(await reader.readexactly(length))
        except ValueError:
            await self._send(writer, 400, b"the body is not JSON\n")
            return
        if not isinstance(body, Mapping):
            await self._send(writer, 400, b"the body is not an AdmissionReview\n")
            return
        message = await decide(body, self.drivers, self.read_class)
        await self._send(writer, 200, json.dumps(answer(body, message)).encode(), "application/json")

    @staticmethod
    async def _send(writer: asyncio.StreamWriter, status: int, data: bytes, content_type: str = "text/plain") -> None:
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 413: "Payload Too Large"}.get(status, "")
        writer.write(
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {len(data)}\r\n"
            f"Connection: close\r\n\r\n".encode()
            + data
        )
        await writer.drain()
        writer.close()
