"""cdiplug.toolkit.supervisor: named, guarded tasks in a real asyncio event loop (no fakes needed).

Covers: a failing task cancels the others cleanly and its own error reaches the caller, logged with
the task's name; tasks that finish or are cancelled just leave; cancel by name; no second task of
one name; join waits for a task by name; nothing spawned after closing; close cancels everything and wait returns.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from cdiplug.errors import BackendError
from cdiplug.toolkit.supervisor import Supervisor, SupervisorClosed


async def forever(cleaned: list[str], name: str) -> None:
    try:
        await asyncio.Event().wait()
    finally:
        cleaned.append(name)


async def test_one_failure_cancels_the_others_and_is_raised(caplog: pytest.LogCaptureFixture) -> None:
    cleaned: list[str] = []
    failed = asyncio.Event()

    async def failing() -> None:
        await failed.wait()
        raise BackendError("sysfs unreadable")

    async with Supervisor() as sup:
        sup.spawn("backend:a", forever(cleaned, "a"))
        sup.spawn("register:b", forever(cleaned, "b"))
        sup.spawn("backend:broken", failing())
        waiter = asyncio.create_task(sup.wait())
        await asyncio.sleep(0)
        assert not waiter.done()
        failed.set()
        with pytest.raises(BackendError, match="sysfs unreadable"):
            await asyncio.wait_for(waiter, 2)
        assert sorted(cleaned) == ["a", "b"]  # cancelled and finished their cleanup
        assert sup.names() == []
        assert sup.failed_task == "backend:broken"
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "backend:broken" in record.getMessage() and "sysfs unreadable" in record.getMessage()
    assert record.exc_info is None  # our own error: its message says it all, no traceback


async def test_a_bug_is_logged_with_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    async def buggy() -> None:
        raise KeyError("oops")

    async with Supervisor() as sup:
        sup.spawn("buggy", buggy())
        with pytest.raises(KeyError):
            await asyncio.wait_for(sup.wait(), 2)
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert record.exc_info is not None and "buggy" in record.getMessage()


async def test_finishing_and_cancelled_tasks_just_leave() -> None:
    cleaned: list[str] = []
    async with Supervisor() as sup:

        async def quick() -> int:
            return 1

        done = sup.spawn("quick", quick())
        sup.spawn("long", forever(cleaned, "long"))
        assert await done == 1
        await asyncio.sleep(0)
        assert sup.names() == ["long"]
        await sup.cancel("long", "no-such-task")
        assert cleaned == ["long"]
        assert sup.names() == []
        assert sup.failure is None


async def test_a_name_runs_once_at_a_time() -> None:
    async with Supervisor() as sup:
        sup.spawn("watch", forever([], "x"))
        with pytest.raises(RuntimeError, match="already running"):
            sup.spawn("watch", forever([], "y"))
        assert sup.running("watch")
        await sup.cancel("watch")
        assert not sup.running("watch")
        sup.spawn("watch", forever([], "z"))  # free again


async def test_join_waits_until_the_named_task_has_ended() -> None:
    async with Supervisor() as sup:
        release, done = asyncio.Event(), []

        async def work() -> None:
            await release.wait()
            done.append("work")

        sup.spawn("work", work())
        joined = asyncio.create_task(sup.join("work"))
        await asyncio.sleep(0)
        assert not joined.done()
        release.set()
        await asyncio.wait_for(joined, 5)
        assert done == ["work"]
        await asyncio.wait_for(sup.join("work"), 1)  # ended (or never ran): at once


async def test_close_cancels_everything_and_wait_returns() -> None:
    cleaned: list[str] = []
    sup = Supervisor()
    sup.spawn("a", forever(cleaned, "a"))
    waiter = asyncio.create_task(sup.wait())
    await asyncio.sleep(0)
    await sup.close()
    await asyncio.wait_for(waiter, 2)  # no error: nothing failed
    assert cleaned == ["a"]
    with pytest.raises(SupervisorClosed):
        sup.spawn("late", forever(cleaned, "late"))


async def test_close_waits_for_slow_cleanup() -> None:
    cleaned: list[str] = []
    started = asyncio.Event()
    sup = Supervisor()

    async def server() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0.01)  # stopping a server takes a moment
            cleaned.append("server")

    sup.spawn("server", server())
    await started.wait()
    await sup.close()
    assert cleaned == ["server"]
    assert sup.names() == []
