"""The seam between the DRA gRPC edge (:mod:`.service`) and claim preparation (:mod:`.prepare`).

:class:`ClaimHandler` is all the edge needs of a driver: prepare one claim, unprepare one claim,
with frozen values in and out (:class:`~cdiplug.dra.claims.ClaimRef`,
:class:`~cdiplug.dra.checkpoint.PreparedClaim`) and cdiplug's own errors
(:class:`~cdiplug.errors.CdiplugError`) for what went wrong with that claim. The edge converts
protobuf to these values and back and chooses the gRPC answers; a handler never sees protobuf,
so a new DRA feature (per-claim configuration, sharing, device status) changes the handler and
leaves the edge alone, and a test can stand a handler of its own behind the real edge.

The edge also says when the kubelet has its answer: it handles each call :func:`after_answer` of
an event set once the call has ended, and work a handler does in the background of a call (the
claim's status write) asks :func:`answer_sent` and waits for it, so that its CPU is not part of
the call as the kubelet times it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Iterator
from typing import Protocol

from cdiplug.dra.checkpoint import PreparedClaim
from cdiplug.dra.claims import ClaimRef


class ClaimHandler(Protocol):
    """NodePrepareResources and NodeUnprepareResources of one driver, one claim at a time."""

    @property
    def resource_name(self) -> str:
        """The resource served (for logs)."""
        ...

    async def prepare(self, ref: ClaimRef) -> PreparedClaim:
        """Prepare ``ref`` (or answer a claim already prepared); CdiplugError for this claim's failure."""
        ...

    async def unprepare(self, ref: ClaimRef) -> None:
        """Release ``ref``; a claim never prepared here is already unprepared."""
        ...


# The event of the kubelet's call being handled, set once its answer is sent (None: no call).
_ANSWERED: contextvars.ContextVar[asyncio.Event | None] = contextvars.ContextVar("cdiplug_dra_answered", default=None)


@contextlib.contextmanager
def after_answer(answered: asyncio.Event) -> Iterator[None]:
    """Handle a call inside: :func:`answer_sent` there (and in tasks started there) is ``answered``."""
    token = _ANSWERED.set(answered)
    try:
        yield
    finally:
        _ANSWERED.reset(token)


def answer_sent() -> asyncio.Event | None:
    """The event set once the answer of the call being handled is sent; None outside a call."""
    return _ANSWERED.get()
