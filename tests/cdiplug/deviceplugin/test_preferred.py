"""The core GetPreferredAllocation policy (cdiplug.deviceplugin.preferred), pure functions against hand-built snapshots.

Unit cases pin each rule (must_include, NUMA span, packing, affinity, replica spread, lowest IDs,
odd requests); hypothesis property tests compare every answer with a brute-force optimum over all
candidate sets on generated NUMA layouts, replicas, must_include lists, sizes and affinity
matrices; further tests check determinism and that large requests stay fast.
"""

from __future__ import annotations

import itertools
import random
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdiplug.deviceplugin import preferred as policy
from cdiplug.deviceplugin.preferred import preferred_allocation
from cdiplug.models.devices import Device, DeviceSnapshot, PreferredRequest
from cdiplug.models.replicas import expand, underlying

RESOURCE = "example.com/dev"


def snap(layout: dict[str, tuple[int, ...]]) -> DeviceSnapshot:
    return DeviceSnapshot(RESOURCE, [Device(i, numa_nodes=n) for i, n in layout.items()])


def ask(s: DeviceSnapshot, size: int, available=None, must=(), **kw) -> tuple[str, ...]:
    available = s.ids if available is None else available
    return preferred_allocation(PreferredRequest(available, must, size), s, **kw)


# -- unit cases --------------------------------------------------------------------------------


def test_fewest_numa_nodes_then_lowest_ids():
    s = snap({f"d{i}": (i % 2,) for i in range(8)})  # d0 d2 d4 d6 on node 0, the rest on node 1
    assert ask(s, 3) == ("d0", "d2", "d4")
    assert ask(s, 4, available=["d1", "d2", "d3", "d5", "d7"]) == ("d1", "d3", "d5", "d7")


def test_packing_prefers_the_node_with_fewer_free_devices():
    s = snap({"a0": (0,), "a1": (0,), "a2": (0,), "a3": (0,), "b0": (1,), "b1": (1,)})
    # Both nodes fit two devices; node 1 has fewer free, so node 0 stays whole.
    assert ask(s, 2) == ("b0", "b1")
    # Three only fit on node 0.
    assert ask(s, 3) == ("a0", "a1", "a2")


def test_packing_counts_free_devices_not_all_devices():
    s = snap({"a0": (0,), "a1": (0,), "a2": (0,), "a3": (0,), "b0": (1,), "b1": (1,), "b2": (1,)})
    # a0 and a1 are taken already: node 0 has 2 free, node 1 has 3.
    assert ask(s, 2, available=["a2", "a3", "b0", "b1", "b2"]) == ("a2", "a3")


def test_span_beats_packing_and_ids():
    s = snap({"a0": (0,), "b0": (1,), "b1": (1,), "b2": (1,)})
    assert ask(s, 2) == ("b0", "b1")  # one node (1) beats a0 + b0 on two


def test_spanning_two_nodes_picks_the_best_fitting_pair():
    s = snap({"a0": (0,), "a1": (0,), "b0": (1,), "b1": (1,), "b2": (1,), "c0": (2,)})
    # 4 devices need two nodes; {0, 2} does not fit, {0, 1} holds 5 free, {1, 2} holds 4.
    assert ask(s, 4) == ("b0", "b1", "b2", "c0")


def test_must_include_comes_first_even_against_numa():
    s = snap({"a0": (0,), "a1": (0,), "b0": (1,), "b1": (1,)})
    assert ask(s, 2, must=["b1"]) == ("b1", "b0")
    # must_include on two nodes: the rest may come from either, so the lowest ID.
    assert ask(s, 3, must=["b1", "a1"]) == ("b1", "a1", "a0")


def test_must_include_longer_than_size_is_answered_whole():
    s = snap({"a0": (0,), "a1": (0,), "a2": (0,)})
    assert ask(s, 1, must=["a2", "a1"]) == ("a2", "a1")
    assert ask(s, 0) == ()


def test_must_include_outside_available_is_kept_and_duplicates_dropped():
    s = snap({"a0": (0,), "a1": (0,), "b0": (1,)})
    assert ask(s, 2, available=["a0", "b0", "b0"], must=["a1", "a1"]) == ("a1", "a0")


def test_size_beyond_available_answers_everything_free():
    s = snap({"a0": (0,), "b0": (1,), "b1": (1,)})
    assert ask(s, 5, must=["b1"]) == ("b1", "a0", "b0")


def test_devices_without_numa_form_one_unknown_group():
    s = snap({"x0": (), "x1": (), "a0": (0,), "b0": (1,)})
    assert ask(s, 2) == ("x0", "x1")
    # IDs the snapshot does not know count as unknown too.
    assert ask(s, 2, available=["a0", "b0", "ghost"]) == ("a0", "b0")


def test_device_on_two_nodes_spans_both():
    s = snap({"w": (0, 1), "a0": (0,), "a1": (0,)})
    assert ask(s, 2) == ("a0", "a1")
    assert ask(s, 2, must=["w"]) == ("w", "a0")


def test_affinity_beats_lowest_ids_but_not_numa():
    s = snap({f"g{i}": (0,) for i in range(4)} | {"h0": (1,), "h1": (1,)})
    pairs = {("g1", "g3"): 10.0, ("h0", "h1"): 100.0}

    def affinity(a: str, b: str) -> float:
        assert a < b
        return pairs.get((a, b), 0.0)

    assert ask(s, 2, affinity=affinity) == ("h0", "h1")  # packing first: node 1 has fewer free
    assert ask(s, 2, available=[f"g{i}" for i in range(4)], affinity=affinity) == ("g1", "g3")
    assert ask(s, 3, available=[f"g{i}" for i in range(4)], affinity=affinity) == ("g0", "g1", "g3")
    assert ask(s, 3, available=[f"g{i}" for i in range(4)], must=["g2"], affinity=affinity) == ("g2", "g1", "g3")


def test_zero_affinity_answers_as_none():
    s = snap({f"g{i}": (0,) for i in range(5)})
    assert ask(s, 2, affinity=lambda a, b: 0.0) == ask(s, 2) == ("g0", "g1")


def test_replicas_spread_over_devices():
    s = expand(snap({"g0": (0,), "g1": (0,), "g2": (0,)}), 3)
    assert ask(s, 2, underlying=underlying) == ("g0::0", "g1::0")
    assert ask(s, 4, underlying=underlying) == ("g0::0", "g0::1", "g1::0", "g2::0")
    assert ask(s, 2, must=["g1::2"], underlying=underlying) == ("g1::2", "g0::0")
    # Without the mapping every replica counts as its own device: lowest IDs.
    assert ask(s, 2) == ("g0::0", "g0::1")


def test_replicas_affinity_is_asked_per_device_pair_once():
    s = expand(snap({"g0": (0,), "g1": (0,), "g2": (0,)}), 4)
    calls: list[tuple[str, str]] = []

    def affinity(a: str, b: str) -> float:
        calls.append((a, b))
        return 5.0 if (a, b) == ("g1", "g2") else 0.0

    assert ask(s, 2, underlying=underlying, affinity=affinity) == ("g1::0", "g2::0")
    assert sorted(calls) == [("g0", "g1"), ("g0", "g2"), ("g1", "g2")]


def test_answer_does_not_depend_on_the_order_of_available():
    s = snap({f"d{i:02}": (i % 3,) for i in range(12)})
    ids = list(s.ids)
    first = ask(s, 5, available=ids)
    rng = random.Random(7)
    for _ in range(20):
        rng.shuffle(ids)
        assert ask(s, 5, available=ids) == first


def test_large_requests_are_fast_and_well_formed():
    s = snap({f"d{i:04}": (i % 8,) for i in range(1024)})
    started = time.process_time()
    answer = ask(s, 300, must=["d0001"])
    assert time.process_time() - started < 0.5
    assert len(answer) == len(set(answer)) == 300 and answer[0] == "d0001"
    # 300 fit on three nodes (128 each) with node 1 included.
    assert len({int(a[1:]) % 8 for a in answer}) == 3


def test_large_affinity_search_falls_back_to_greedy(monkeypatch):
    s = snap({f"g{i:02}": (0,) for i in range(40)})
    best = {("g07", "g31"): 3.0, ("g07", "g22"): 2.0, ("g22", "g31"): 2.0}

    def affinity(a: str, b: str) -> float:
        return best.get((a, b), 0.0)

    started = time.process_time()
    answer = ask(s, 3, affinity=affinity)  # C(40, 3) = 9880 > EXACT_LIMIT: greedy
    assert time.process_time() - started < 0.5
    assert answer == ("g07", "g22", "g31")
    monkeypatch.setattr(policy, "EXACT_LIMIT", 10**6)
    assert ask(s, 3, affinity=affinity) == ("g07", "g22", "g31")


def test_many_numa_nodes_fall_back_to_greedy_node_choice():
    # 20 nodes: trying every pair of nodes and more exceeds NODE_SET_LIMIT.
    s = snap({f"n{n:02}-{j}": (n,) for n in range(20) for j in range(1 + n % 3)})
    answer = ask(s, 5)
    assert len(answer) == 5
    nodes = {int(a[1:3]) for a in answer}
    assert len(nodes) == 2  # 3 devices on the fullest nodes: two nodes suffice, and greedy finds it


# -- property tests against a brute-force optimum ---------------------------------------------


def brute_force(request, snapshot, affinity, under):
    """Every rule of the module docstring, literally, over every candidate set."""
    must = tuple(dict.fromkeys(request.must_include))
    if request.size <= len(must):
        return must
    rest = sorted(set(request.available) - set(must))
    k = request.size - len(must)
    if k >= len(rest):
        return must + tuple(rest)

    def nodes(i):
        d = snapshot.get(i)
        return set(d.numa_nodes) if d is not None and d.numa_nodes else {"unknown"}

    free: dict[object, int] = {}
    for i in (*must, *rest):
        for n in nodes(i):
            free[n] = free.get(n, 0) + 1

    def key(picks):
        chosen = (*must, *picks)
        spanned = set().union(*(nodes(i) for i in chosen))
        packing = sum(free[n] for n in spanned)
        score = 0.0
        for a, b in itertools.combinations(chosen, 2):
            ua, ub = under(a), under(b)
            if affinity is not None and ua != ub:
                score += affinity(min(ua, ub), max(ua, ub))
        distinct = len({under(i) for i in chosen})
        return (len(spanned), packing, -score, -distinct, sorted(picks))

    best = min(itertools.combinations(rest, k), key=key)
    return must + tuple(sorted(best))


NUMA_CHOICES = [(), (0,), (0,), (1,), (1,), (2,), (3,), (0, 1), (2, 3)]


@st.composite
def cases(draw):
    n = draw(st.integers(1, 7))
    replicas = draw(st.sampled_from([1, 1, 2, 3]))
    base = DeviceSnapshot(RESOURCE, [Device(f"dev-{j}", numa_nodes=draw(st.sampled_from(NUMA_CHOICES))) for j in range(n)])
    snapshot = expand(base, replicas)
    ids = list(snapshot.ids) + ["ghost-0"]
    available = draw(st.lists(st.sampled_from(ids), max_size=11))
    must = draw(st.lists(st.sampled_from(ids), max_size=3))
    size = draw(st.integers(0, len(set(available) | set(must)) + 1))
    with_affinity = draw(st.booleans())
    scores = {}
    if with_affinity:
        for a, b in itertools.combinations(sorted(base.ids + ("ghost-0",)), 2):
            scores[(a, b)] = float(draw(st.integers(-2, 3)))
    affinity = (lambda a, b: scores[(a, b)]) if with_affinity else None
    under = underlying if replicas > 1 else (lambda i: i)
    return PreferredRequest(available, must, size), snapshot, affinity, under


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_matches_brute_force(case):
    request, snapshot, affinity, under = case
    assert preferred_allocation(request, snapshot, affinity=affinity, underlying=under) == brute_force(
        request, snapshot, affinity, under
    )


@settings(max_examples=150, deadline=None)
@given(cases(), st.randoms(use_true_random=False))
def test_answer_is_deterministic_and_well_formed(case, rng):
    request, snapshot, affinity, under = case
    answer = preferred_allocation(request, snapshot, affinity=affinity, underlying=under)
    shuffled = list(request.available)
    rng.shuffle(shuffled)
    again = PreferredRequest(shuffled, request.must_include, request.size)
    assert preferred_allocation(again, snapshot, affinity=affinity, underlying=under) == answer
    must = tuple(dict.fromkeys(request.must_include))
    assert answer[: len(must)] == must
    assert len(set(answer)) == len(answer)
    possible = len(must) + len(set(request.available) - set(must))
    assert len(answer) == max(len(must), min(request.size, possible))


@settings(max_examples=100, deadline=None)
@given(cases())
def test_greedy_fallbacks_stay_well_formed(case):
    request, snapshot, affinity, under = case
    saved = policy.EXACT_LIMIT, policy.NODE_SET_LIMIT
    policy.EXACT_LIMIT, policy.NODE_SET_LIMIT = 0, 0
    try:
        answer = preferred_allocation(request, snapshot, affinity=affinity, underlying=under)
    finally:
        policy.EXACT_LIMIT, policy.NODE_SET_LIMIT = saved
    must = tuple(dict.fromkeys(request.must_include))
    assert answer[: len(must)] == must and len(set(answer)) == len(answer)
    possible = len(must) + len(set(request.available) - set(must))
    assert len(answer) == max(len(must), min(request.size, possible))


def test_affinity_is_not_weighed_beyond_its_device_limit(monkeypatch):
    s = snap({f"g{i}": (0,) for i in range(6)})

    def affinity(a: str, b: str) -> float:
        return 9.0 if (a, b) == ("g4", "g5") else 0.0

    assert ask(s, 2, affinity=affinity) == ("g4", "g5")
    monkeypatch.setattr(policy, "AFFINITY_LIMIT", 5)
    assert ask(s, 2, affinity=affinity) == ("g0", "g1")


def test_large_requests_with_affinity_stay_fast():
    s = expand(snap({f"g{i:03}": (i % 4,) for i in range(1024)}), 1)
    started = time.process_time()
    ask(s, 300, affinity=lambda a, b: 1.0)  # 1024 devices: beyond AFFINITY_LIMIT
    shared = expand(snap({f"g{i:02}": (i % 4,) for i in range(64)}), 16)  # 64 GPUs, 1024 replicas
    answer = ask(shared, 32, affinity=lambda a, b: float(a[-1] == b[-1]), underlying=underlying)
    assert time.process_time() - started < 0.5
    assert len(answer) == 32


def test_one_device_among_many_replicas_with_affinity_is_fast():
    shared = expand(snap({f"g{i:03}": (0,) for i in range(100)}), 40)  # 4000 IDs, C(4000, 1) exact
    started = time.process_time()
    answer = ask(shared, 2, must=["g007::3"], affinity=lambda a, b: float(b == "g042"), underlying=underlying)
    assert time.process_time() - started < 0.5
    assert answer == ("g007::3", "g042::0")
