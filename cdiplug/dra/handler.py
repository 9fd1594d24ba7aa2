"""The seam between the DRA gRPC edge (:mod:`.service`) and claim preparation (:mod:`.prepare`).

:class:`ClaimHandler` is all the edge needs of a driver: prepare one claim, unprepare one claim,
with frozen values in and out (:class:`~cdiplug.dra.claims.ClaimRef`,
:class:`~cdiplug.dra.checkpoint.PreparedClaim`) and cdiplug's own errors
(:class:`~cdiplug.errors.CdiplugError`) for what went wrong with that claim. The edge converts
protobuf to these values and back and chooses the gRPC answers; a handler never sees protobuf,
so a new DRA feature (per-claim configuration, sharing, device status) changes the handler and
leaves the edge alone, and a test can stand a handler of its own behind the real edge.
"""

from __future__ import annotations

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
