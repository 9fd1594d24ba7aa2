"""A driver's claim status writes (:mod:`.status`), in the background of the kubelet's answers.

:class:`StatusWriter` writes each claim's status after the prepare or unprepare that asked for it
has answered: in order per claim (a clear never overtakes the write before it); at most
:data:`WRITERS` at once per driver; a write asked for while an older one of the same claim still
waits replaces it. In a burst of pods the HTTP client's connection pool stays small (with one
request per claim at once, its bookkeeping cost more CPU than the prepares) and a claim prepared
and unprepared before its turn is written once: only the last state of a claim matters.

"After the answer" is literal: a write asked for while the gRPC edge handles a call waits until
that call's answer is sent (:func:`~.handler.answer_sent`; at most :data:`ANSWER_WAIT`). A write
is several milliseconds of the event loop's CPU (building the request, the HTTP client), which
would otherwise run before the answer is sent and be timed by the kubelet as part of the prepare.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from attrs import frozen

from cdiplug.dra.handler import answer_sent
from cdiplug.dra.status import publish
from cdiplug.kube.client import KubeClient

WRITERS = 4  # status writes of one driver at once: a burst of pods does not open a connection per claim
ANSWER_WAIT = 1.0  # seconds a write waits for its call's answer to be sent (a call that never ends: written anyway)


@frozen
class _Wanted:
    namespace: str
    name: str
    entries: list[dict[str, Any]]
    answered: asyncio.Event | None  # set once the answer of the call that asked is sent (None: write at once)


class StatusWriter:
    """One driver's status writes (see the module docstring); a failure is logged (:func:`~.status.publish`)."""

    def __init__(self, client: Callable[[], KubeClient], driver: str) -> None:
        self.client = client
        self.driver = driver
        self._wanted: dict[str, _Wanted] = {}  # by claim UID: not begun yet
        self._writers: dict[str, asyncio.Task[None]] = {}  # by claim UID: writes the claim's wanted status
        self._slots = asyncio.Semaphore(WRITERS)

    def write(self, namespace: str, name: str, uid: str, entries: list[dict[str, Any]]) -> None:
        """Make our entries of the claim's ``status.devices`` exactly ``entries``, after the writes before."""
        self._wanted[uid] = _Wanted(namespace, name, entries, answer_sent())
        if uid not in self._writers:
            self._writers[uid] = asyncio.create_task(self._write(uid), name=f"dra-status:{self.driver}:{uid}")

    async def _write(self, uid: str) -> None:
        try:
            while (wanted := self._wanted.get(uid)) is not None:
                if wanted.answered is not None and not wanted.answered.is_set():
                    with contextlib.suppress(TimeoutError):  # the kubelet's answer first (module docstring)
                        async with asyncio.timeout(ANSWER_WAIT):
                            await wanted.answered.wait()
                async with self._slots:
                    wanted = self._wanted.pop(uid)  # the latest, taken once it can be written
                    await publish(self.client, self.driver, wanted.namespace, wanted.name, uid, wanted.entries)
        finally:
            del self._writers[uid]  # no await since the loop's check: a write asked for now starts a new writer

    async def settled(self) -> None:
        """Until every write asked for so far has ended (tests; a clean stop)."""
        while self._writers:
            await asyncio.gather(*self._writers.values(), return_exceptions=True)
