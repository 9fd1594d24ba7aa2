"""Polling with a bound, for state that has no event to wait on: :func:`eventually`.

Where something can be awaited (an ``asyncio.Event``, a stand-in's ``wait_for``, a daemon's log
line), await it; where nothing can, poll it with :func:`eventually`, never sleep a guessed time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


async def eventually(
    check: Callable[[], T], what: str = "the condition", *, timeout: float = 10.0, interval: float = 0.01, in_thread: bool = False
) -> T:
    """``check()`` until it returns something true, and that value; AssertionError naming ``what`` after ``timeout`` s.

    ``in_thread``: ``check`` blocks (an HTTP query, a subprocess), so each call runs in a thread.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = await asyncio.to_thread(check) if in_thread else check()
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(interval)
