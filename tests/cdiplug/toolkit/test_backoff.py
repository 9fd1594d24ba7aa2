"""The backoff every retrying loop uses: doubling to a cap, reset, jitter within bounds, bad knobs refused."""

from __future__ import annotations

import itertools
import time

import pytest

from cdiplug.toolkit.backoff import Backoff


def test_delays_grow_by_the_factor_up_to_the_cap() -> None:
    assert list(itertools.islice(Backoff(0.5, 30.0), 9)) == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert list(itertools.islice(Backoff(1.0, 10.0, factor=3.0), 4)) == [1.0, 3.0, 9.0, 10.0]
    assert list(itertools.islice(Backoff(2.0, 2.0), 3)) == [2.0, 2.0, 2.0]


def test_reset_starts_again_from_the_initial_delay() -> None:
    backoff = Backoff(1.0, 60.0)
    assert [next(backoff) for _ in range(4)] == [1.0, 2.0, 4.0, 8.0]
    backoff.reset()
    assert [next(backoff) for _ in range(2)] == [1.0, 2.0]


def test_jitter_spreads_each_delay_within_its_bounds_and_never_past_the_spread_cap() -> None:
    backoff = Backoff(0.05, 2.0, jitter=0.2)
    delays = list(itertools.islice(backoff, 200))
    bases = list(itertools.islice(Backoff(0.05, 2.0), 200))
    assert all(b * 0.8 <= d <= b * 1.2 for d, b in zip(delays, bases))
    assert len(set(delays[-100:])) > 1  # spread, not a constant
    assert max(delays) <= 2.0 * 1.2


@pytest.mark.parametrize(
    ("initial", "cap", "factor", "jitter", "word"),
    [
        (0.0, 1.0, 2.0, 0.0, "initial"),
        (2.0, 1.0, 2.0, 0.0, "cap"),
        (1.0, 2.0, 0.5, 0.0, "factor"),
        (1.0, 2.0, 2.0, 1.0, "jitter"),
    ],
)
def test_bad_knobs_are_refused_naming_them(initial: float, cap: float, factor: float, jitter: float, word: str) -> None:
    with pytest.raises(ValueError, match=word):
        Backoff(initial, cap, factor=factor, jitter=jitter)


async def test_sleep_waits_the_delay_it_returns() -> None:
    backoff = Backoff(0.01, 0.02)
    started = time.monotonic()
    assert await backoff.sleep() == 0.01
    assert await backoff.sleep() == 0.02
    assert time.monotonic() - started >= 0.03
