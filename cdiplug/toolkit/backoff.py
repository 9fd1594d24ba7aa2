"""Delays between tries: the one backoff every retrying loop of cdiplug uses.

A :class:`Backoff` is an endless iterator of delays: ``initial``, then each times ``factor``,
never above ``cap``; :meth:`~Backoff.reset` starts again from ``initial`` (after a success, or a
run that lasted). ``jitter`` spreads each delay evenly over ``±jitter`` of itself, so that several
loops waiting on one recovering peer (a kubelet, an API server) do not try again in lockstep; the
sequence itself is not jittered, so the cap holds before the spread.

Loops that log the delay take it with ``next()`` and sleep themselves (``asyncio.sleep``, or an
``Event.wait`` on a thread); :meth:`~Backoff.sleep` is the same for a loop that only waits.
"""

from __future__ import annotations

import asyncio


class Backoff:
    """``initial``, ``initial * factor``, ... up to ``cap``, each spread by ``±jitter`` (a fraction)."""

    __slots__ = ("initial", "cap", "factor", "jitter", "_next")

    def __init__(self, initial: float, cap: float, *, factor: float = 2.0, jitter: float = 0.0) -> None:
        if not 0 < initial <= cap:
            raise ValueError(f"backoff needs 0 < initial <= cap, got initial {initial} and cap {cap}")
        if factor < 1:
            raise ValueError(f"backoff factor must be at least 1, got {factor}")
        if not 0 <= jitter < 1:
            raise ValueError(f"backoff jitter must be in [0, 1), got {jitter}")
        self.initial = initial
        self.cap = cap
        self.factor = factor
        self.jitter = jitter
        self._next = initial

    def __iter__(self) -> Backoff:
        return self

    def __next__(self) -> float:
        delay = self._next
        self._next = min(delay * self.factor, self.cap)
        if self.jitter:
            import random  # at the first retry, not in every start-up (about 1 ms of imports)

            delay *= random.uniform(1 - self.jitter, 1 + self.jitter)
        return delay

    def reset(self) -> None:
        """The next delay is ``initial`` again."""
        self._next = self.initial

    async def sleep(self) -> float:
        """Sleep for the next delay; returns it."""
        delay = next(self)
        await asyncio.sleep(delay)
        return delay

    def __repr__(self) -> str:
        return f"Backoff(initial={self.initial}, cap={self.cap}, factor={self.factor}, jitter={self.jitter})"
