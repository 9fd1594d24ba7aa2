"""The DRA gRPC edge (cdiplug.dra.service) over a real gRPC unix socket, with a handler of the test's own.

Covers: while a claim of a NodePrepareResources or NodeUnprepareResources call is handled, the
handler sees the call's answer event (``answer_sent``) unset, for every claim of the call, and the
edge sets it once the call has ended (the kubelet stand-in holds the answer). A handler's
background work (the claim's status write) waits for it (tests/cdiplug/dra/test_status.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cdiplug.dra.claims import ClaimRef
from cdiplug.dra.handler import answer_sent
from cdiplug.dra.records import PreparedClaim
from cdiplug.dra.service import add_to_server
from cdiplug.testing.dra_kubelet import DraPluginConnection, PluginInfo
from cdiplug.wire.unixserver import UnixServer

DRIVER = "fpga.example.com"


class SeesTheAnswer:
    """A ClaimHandler that keeps, per claim UID, the answer event it saw and whether it was set then."""

    resource_name = "example.com/fpga"

    def __init__(self) -> None:
        self.seen: dict[str, tuple[asyncio.Event | None, bool]] = {}

    def _see(self, uid: str) -> None:
        event = answer_sent()
        self.seen[uid] = (event, event is not None and event.is_set())

    async def prepare(self, ref: ClaimRef) -> PreparedClaim:
        self._see(ref.uid)
        await asyncio.sleep(0)  # a handler awaits (the API read, the checkpoint): the answer is still not sent
        return PreparedClaim(ref.uid, ref.namespace, ref.name, DRIVER, self.resource_name)

    async def unprepare(self, ref: ClaimRef) -> None:
        self._see(ref.uid)


@pytest.fixture
async def served(short_tmp: Path) -> AsyncIterator[tuple[SeesTheAnswer, DraPluginConnection]]:
    handler = SeesTheAnswer()
    socket = short_tmp / "dra.sock"
    server = UnixServer(socket, lambda s: add_to_server(s, handler))
    await server.start()
    conn = DraPluginConnection(PluginInfo("DRAPlugin", DRIVER, str(socket), ("v1.DRAPlugin",)), "v1.DRAPlugin", 5.0)
    try:
        yield handler, conn
    finally:
        await conn.close()
        await server.stop()


@pytest.mark.parametrize("call", ["prepare", "unprepare"])
async def test_the_answer_event_is_set_once_the_kubelet_has_the_answer(
    served: tuple[SeesTheAnswer, DraPluginConnection], call: str
) -> None:
    handler, conn = served
    claims = [ClaimRef("default", f"c{i}", f"uid-{i}") for i in range(3)]
    answer = await (conn.prepare(claims) if call == "prepare" else conn.unprepare(claims))
    assert set(answer) == {c.uid for c in claims}
    events = {event for event, _ in handler.seen.values()}
    assert len(events) == 1  # one per call, shared by its claims
    (event,) = events
    assert event is not None
    assert not any(set_then for _, set_then in handler.seen.values())  # unset while the claims were handled
    await asyncio.wait_for(event.wait(), 5)  # set by the call's end
