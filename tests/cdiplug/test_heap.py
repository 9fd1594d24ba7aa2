"""The garbage collector and malloc around start-up (``cdiplug.heap``).

Covers: :func:`pause` turns a running collector off and :func:`settle` turns it on again, after
collecting start-up's cyclic garbage and freezing what survived; a collector the embedding program
turned off stays off; only ``cdiplug serve`` pauses it, first thing; :func:`one_malloc_arena` and
the trim run on this machine's glibc. The daemon's use of them (settling only once the kubelet knows every resource) is in
``tests/integration/test_lifecycle.py``.
"""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import weakref
from collections.abc import Iterator

import pytest

from cdiplug import heap


@pytest.fixture(autouse=True)
def collector_restored() -> Iterator[None]:
    enabled = gc.isenabled()
    yield
    heap._paused = False
    (gc.enable if enabled else gc.disable)()


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def _garbage_cycle() -> weakref.ref[_Node]:
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    return weakref.ref(a)


def test_pause_then_settle_collects_freezes_and_turns_the_collector_on_again() -> None:
    gc.enable()
    heap.pause()
    assert not gc.isenabled() and heap.paused()
    cycle = _garbage_cycle()
    for _ in range(10_000):
        _garbage_cycle()  # enough allocations to have triggered a pass many times over
    assert cycle() is not None, "the collector ran while paused"
    frozen_before = gc.get_freeze_count()
    found = heap.settle()
    assert cycle() is None and found >= 2
    assert gc.isenabled() and not heap.paused()
    assert gc.get_freeze_count() > frozen_before


def test_a_collector_turned_off_by_the_embedding_program_stays_off() -> None:
    gc.disable()
    heap.pause()
    assert not heap.paused()
    cycle = _garbage_cycle()
    heap.settle()
    assert cycle() is None  # settled all the same
    assert not gc.isenabled()


def test_malloc_calls_work_on_this_glibc() -> None:
    assert heap._libc() is not None  # CI runs on glibc (Debian/Ubuntu): the calls must be found
    heap.one_malloc_arena()
    heap.settle()


@pytest.mark.parametrize(("command", "paused"), [("serve", True), ("discover", False)])
def test_only_cdiplug_serve_pauses_the_collector_first_thing(command: str, paused: bool) -> None:
    # cdiplug.__main__ (the console script and `python -m cdiplug`) pauses it before the command
    # line is even parsed; the other commands run as Python has it.
    code = textwrap.dedent(
        f"""
        import gc, sys
        from unittest import mock
        import cdiplug.__main__ as entry
        sys.argv = ["cdiplug", {command!r}]
        seen = []
        with mock.patch("cdiplug.cli.main", lambda: seen.append(gc.isenabled()) or 0):
            entry.main()
        print(seen)
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == f"[{not paused}]"
