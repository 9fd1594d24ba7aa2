"""The fault switches of the API-server stand-in (:class:`~cdiplug.testing.apiserver.ApiServerStandIn`).

Each is small and off by default; the DRA chaos tests (tests/chaos/test_dra_api_faults.py) turn
them on:

- ``refuse``: connections are accepted and closed at once, unread (a server going away; each
  counts in ``refused``); :meth:`~FaultSwitches.drop_connections` closes the open ones too;
- :meth:`~FaultSwitches.cut_watches` drops every open watch mid-stream (no final chunk, as a
  restarting server or a broken link does);
- ``gone_watches``: that many next watches get the ``ERROR`` event of ``410 Gone``
  (compaction), as the API server sends it;
- ``conflict_every_other``: every other update of a ResourceSlice is answered ``409 Conflict``
  after a second writer changed it (an annotation and a new resourceVersion);
- ``raw_answer``: every request is answered with these bytes as they are (status line, headers,
  body) and the connection closed: what a proxy or a broken server sends, a 500 without a
  ``Content-Type`` or a redirect, say;
- ``throttle``: that many next requests but watches are answered ``429 Too Many Requests`` with
  ``Retry-After: <retry_after>`` (when: ``throttled_at``; every other request: ``received_at``).

:meth:`~FaultSwitches.count` tells how many requests of a method and path were served; with
``stall`` (accept requests, never answer) the stand-in is a server that goes silent.
"""

from __future__ import annotations

import asyncio
import copy
import json
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cdiplug.testing.apiserver import Key, Received


class HttpError(Exception):
    """An answer other than success: ``code``, the Status ``reason`` and ``message``."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        self.code, self.reason, self.message = code, reason, message
        super().__init__(message)


def _is_watch(query: Mapping[str, str]) -> bool:
    return query.get("watch") in ("true", "1")


class FaultSwitches:
    """The switches and what they do; the stand-in calls the ``_`` methods where they apply."""

    received: list[Received]
    _objects: dict[Key, dict[str, Any]]
    _connections: dict[asyncio.Task[None], asyncio.StreamWriter]

    def __init__(self) -> None:
        self.refuse = False  # accept connections and close them at once
        self.refused = 0  # connections closed so
        self.gone_watches = 0  # this many next watches answered 410 Gone
        self.conflict_every_other = False  # every other slice update: 409 after a second writer's change
        self.raw_answer: bytes | None = None  # every request answered with these bytes, as they are
        self.throttle = 0  # this many next requests (watches aside) answered 429
        self.retry_after = 1  # seconds, in the 429's Retry-After
        self.throttled_at: list[float] = []  # time.monotonic() of each 429
        self.received_at: list[float] = []  # time.monotonic() of each request but watches
        self._updates = 0
        self._watches: set[asyncio.StreamWriter] = set()

    def count(self, method: str, path_part: str = "", *, watch: bool | None = None) -> int:
        """Requests of ``method`` whose path holds ``path_part``; ``watch`` True/False: only watches / no watches."""
        return sum(
            r.method == method and path_part in r.path and (watch is None or _is_watch(r.query) == watch) for r in self.received
        )

    def drop_connections(self) -> None:
        """Close every open connection at once (with ``refuse``: the server is gone)."""
        for writer in self._connections.values():
            writer.transport.abort()

    def cut_watches(self) -> int:
        """Drop every open watch mid-stream (the connection closed, no final chunk); how many were."""
        cut = list(self._watches)
        for writer in cut:
            writer.transport.abort()
        self._watches.clear()
        return len(cut)

    # -- where the stand-in applies them --

    def _seen(self, query: Mapping[str, str]) -> None:
        if not _is_watch(query):
            self.received_at.append(time.monotonic())

    async def _answered_raw(self, writer: asyncio.StreamWriter) -> bool:
        """With ``raw_answer``: write it (the connection then closes); whether it did."""
        if self.raw_answer is None:
            return False
        writer.write(self.raw_answer)
        await writer.drain()
        return True

    def _throttled(self, query: Mapping[str, str]) -> str:
        """The Retry-After header line when this request is to be answered 429, else empty."""
        if self.throttle <= 0 or _is_watch(query):
            return ""
        self.throttle -= 1
        self.throttled_at.append(time.monotonic())
        return f"Retry-After: {self.retry_after}\r\n"

    def _conflicting(self, key: Key) -> None:
        """On an update: every other one, a second writer changes the object first, and this one is 409."""
        if not self.conflict_every_other:
            return
        self._updates += 1
        if self._updates % 2:
            other = copy.deepcopy(self._objects[key])
            other["metadata"].setdefault("annotations", {})["example.com/second-writer"] = str(self._updates)
            self._store(key, other, create_only=False)
            raise HttpError(
                409, "Conflict", f'Operation cannot be fulfilled on {key[0]} "{key[2]}": the object has been modified'
            )

    def _store(self, key: Key, obj: dict[str, Any], create_only: bool, expect_version: str | None = None) -> dict[str, Any]:
        raise NotImplementedError  # the stand-in's

    def _gone(self, writer: asyncio.StreamWriter, since: int, now: int) -> bool:
        """With ``gone_watches``: write the 410 Gone event and the stream's end; whether it did."""
        if self.gone_watches <= 0:
            return False
        self.gone_watches -= 1
        gone = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "code": 410, "reason": "Expired"}
        gone["message"] = f"too old resource version: {since} ({now})"
        line = json.dumps({"type": "ERROR", "object": gone}).encode() + b"\n"
        writer.write(f"{len(line):x}\r\n".encode() + line + b"\r\n0\r\n\r\n")
        return True
