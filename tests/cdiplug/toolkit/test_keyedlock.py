"""cdiplug.toolkit.keyedlock: one lock per key, others concurrent, forgotten once nobody holds or waits for it."""

from __future__ import annotations

import asyncio

import pytest

from cdiplug.toolkit.keyedlock import KeyedLock


async def test_one_key_at_a_time_other_keys_meanwhile() -> None:
    locks: KeyedLock[str] = KeyedLock()
    order: list[str] = []
    a_inside = asyncio.Event()
    release_a = asyncio.Event()

    async def first() -> None:
        async with locks("a"):
            order.append("a1 in")
            a_inside.set()
            await release_a.wait()
            order.append("a1 out")

    async def second() -> None:
        async with locks("a"):
            order.append("a2 in")

    t1 = asyncio.create_task(first())
    await a_inside.wait()
    t2 = asyncio.create_task(second())
    async with locks("b"):  # another key is not held up by "a"
        order.append("b")
    assert locks.locked("a") and not locks.locked("b") and len(locks) == 1
    release_a.set()
    await asyncio.gather(t1, t2)
    assert order == ["a1 in", "b", "a1 out", "a2 in"]
    assert len(locks) == 0  # forgotten


async def test_an_error_or_a_cancel_lets_go() -> None:
    locks: KeyedLock[int] = KeyedLock()
    with pytest.raises(RuntimeError):
        async with locks(1):
            raise RuntimeError("boom")
    held = asyncio.Event()

    async def hold() -> None:
        async with locks(1):
            held.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(hold())
    await held.wait()
    waiter = asyncio.create_task(asyncio.wait_for(locks(1).__aenter__(), 0.05))
    with pytest.raises(TimeoutError):
        await waiter
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(locks) == 0
