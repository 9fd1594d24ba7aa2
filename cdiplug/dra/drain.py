"""Draining a driver: the resource leaves DRA on this node while claims of it are prepared.

Claims not prepared yet are refused, prepared ones are still answered and unprepared, and the
front end is told once none of the driver's claims is left in the checkpoint, so it stops the
driver's sockets only then (the kubelet needs them to unprepare: without, a pod using a claim
would stay Terminating).
"""

from __future__ import annotations

from collections.abc import Callable

from cdiplug.dra.checkpoint import ClaimStore


class Drain:
    """Whether one driver drains, and the call once its last claim is gone."""

    def __init__(self, store: ClaimStore, driver: str) -> None:
        self.store = store
        self.driver = driver
        self._drained: Callable[[], None] | None = None  # set while draining: called once none is left

    @property
    def active(self) -> bool:
        return self._drained is not None

    def start(self, drained: Callable[[], None]) -> None:
        """Drain from now on; ``drained`` is called once no claim of the driver is left (at once when none is)."""
        self._drained = drained
        self.check()

    def check(self) -> None:
        """After an unprepare: call ``drained`` (once) when the driver's last claim is gone."""
        if self._drained is not None and not any(c.driver == self.driver for c in self.store.all()):
            drained, self._drained = self._drained, None
            drained()
