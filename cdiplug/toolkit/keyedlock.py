"""One asyncio lock per key, kept only while someone holds or waits for it.

:class:`KeyedLock` serializes work on one key (a claim UID, a preparation group) while work on
other keys runs concurrently: ``async with locks(key): ...``. A key's lock is made on first use
and forgotten when its last holder or waiter leaves, so a daemon that sees millions of claims
over months keeps only the locks in use (``len(locks)``). Event-loop only, like asyncio.Lock.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Hashable
from contextlib import asynccontextmanager
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class _Entry:
    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0


class KeyedLock(Generic[K]):
    """A ref-counted map of key -> asyncio.Lock (see the module docstring)."""

    def __init__(self) -> None:
        self._entries: dict[K, _Entry] = {}

    @asynccontextmanager
    async def __call__(self, key: K) -> AsyncIterator[None]:
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = _Entry()
        entry.users += 1
        try:
            async with entry.lock:
                yield
        finally:
            entry.users -= 1
            if entry.users == 0:
                del self._entries[key]

    def locked(self, key: K) -> bool:
        """Whether someone holds ``key`` now."""
        entry = self._entries.get(key)
        return entry is not None and entry.lock.locked()

    def __len__(self) -> int:
        return len(self._entries)
