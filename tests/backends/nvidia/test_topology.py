"""Topology scores and preferred sets on FakeNvml's three fixtures, checked against brute force.

Fixtures: an 8-GPU NVSwitch machine (every pair 18 NVLinks; PCIe and NUMA decide), a 2x4 machine
with NVLink-bridged pairs, a 4-GPU PCIe-only box. Hypothesis draws available sets, must-include
sets and sizes; the exact search must reach the brute-force maximum every time. Also replicas
(spread / pack) and the NUMA fallback when NVML cannot give a PCIe level.
"""

from __future__ import annotations

import itertools
import random
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdiplug.models.devices import PreferredRequest
from cdiplug.models.replicas import replica_id
from cdiplug.models.world import World
from cdiplug_backends.nvidia import topology
from cdiplug_backends.nvidia.discovery import discover
from cdiplug_backends.nvidia.nvml import Nvml, PcieLevel
from cdiplug_backends.nvidia.options import ReplicaStrategy
from cdiplug_backends.nvidia.testing import FakeNvml
from cdiplug_backends.nvidia.testing import nvml as fake_module
from cdiplug_backends.nvidia.topology import PairLink, Topology, best_set, preferred, set_score

FIXTURES = {"nvswitch8": FakeNvml.nvswitch8, "nvlink_pairs": FakeNvml.nvlink_pairs, "pcie_box": FakeNvml.pcie_box}


def read(fake: FakeNvml) -> tuple[list[str], Topology]:
    """The GPU UUIDs (in index order) and topology of a fake machine, as the backend reads them."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        fake.write_sysfs(Path(tmp))
        nvml = Nvml(fake)
        nvml.init()
        gpus = discover(nvml, World(sysfs_root=tmp, dev_root=tmp)).gpus
        return [g.uuid for g in gpus], topology.read_topology(nvml, gpus)


MACHINES = {name: read(make()) for name, make in FIXTURES.items()}


def brute_best(available: list[str], size: int, must: list[str], score) -> int:
    return max(set_score(c, score) for c in itertools.combinations(available, size) if set(must) <= set(c))


def test_scores_on_the_fixtures() -> None:
    ids, topo = MACHINES["nvlink_pairs"]
    assert topo.link(ids[0], ids[1]) == PairLink(pcie=PcieLevel.HOST_BRIDGE, nvlinks=4)
    assert [topo.score(ids[0], ids[i]) for i in range(1, 8)] == [430, 50, 30, 10, 10, 10, 10]
    ids, topo = MACHINES["nvswitch8"]
    assert topo.link(ids[0], ids[7]) == PairLink(pcie=PcieLevel.ACROSS_CPUS, nvlinks=18)  # through the switches
    assert [topo.score(ids[0], ids[i]) for i in (1, 2, 4)] == [1850, 1820, 1810]
    ids, topo = MACHINES["pcie_box"]
    assert [topo.score(ids[0], ids[i]) for i in (1, 2, 3)] == [50, 10, 10]
    assert topo.score(ids[0], ids[0]) == 0 and topo.score(ids[0], "GPU-unknown") == 0


def test_numa_stands_in_when_nvml_cannot_give_a_pcie_level() -> None:
    def broken(a: int, b: int) -> int:
        raise fake_module.NVMLError(fake_module.NVML_ERROR_NOT_SUPPORTED)

    ids, topo = read(FakeNvml(FakeNvml.pcie_box().gpus, broken))  # the box, but NVML cannot say
    assert topo.link(ids[0], ids[1]) == PairLink(pcie=None, nvlinks=0)
    assert topo.score(ids[0], ids[1]) == 20 and topo.score(ids[0], ids[2]) == 10


@pytest.mark.parametrize(
    ("machine", "size", "must", "available", "expected"),
    [
        ("nvlink_pairs", 2, [], None, [0, 1]),
        ("nvlink_pairs", 4, [], None, [0, 1, 2, 3]),
        ("nvlink_pairs", 2, [5], None, [4, 5]),
        ("nvlink_pairs", 2, [], [1, 2, 3, 5, 6, 7], [2, 3]),
        ("nvlink_pairs", 4, [], [0, 2, 3, 4, 5, 6, 7], [4, 5, 6, 7]),
        ("nvswitch8", 2, [], None, [0, 1]),
        ("nvswitch8", 4, [], None, [0, 1, 2, 3]),
        ("nvswitch8", 4, [], [0, 2, 4, 5, 6, 7], [4, 5, 6, 7]),
        ("pcie_box", 2, [], None, [0, 1]),
        ("pcie_box", 2, [2], None, [2, 3]),
    ],
)
def test_expected_sets(machine: str, size: int, must: list[int], available: list[int] | None, expected: list[int]) -> None:
    ids, topo = MACHINES[machine]
    avail = [ids[i] for i in (available if available is not None else range(len(ids)))]
    got = best_set(avail, size, topo.score, [ids[i] for i in must])
    assert got is not None and sorted(ids.index(u) for u in got) == expected


@settings(max_examples=150, deadline=None)
@given(data=st.data(), machine=st.sampled_from(sorted(MACHINES)))
def test_best_set_matches_brute_force(data: st.DataObject, machine: str) -> None:
    ids, topo = MACHINES[machine]
    available = data.draw(st.lists(st.sampled_from(ids), min_size=1, unique=True), label="available")
    size = data.draw(st.integers(1, len(available)), label="size")
    must = data.draw(st.lists(st.sampled_from(available), max_size=size, unique=True), label="must")
    got = best_set(available, size, topo.score, must)
    assert got is not None
    assert len(got) == size and len(set(got)) == size
    assert set(must) <= set(got) <= set(available)
    assert set_score(got, topo.score) == brute_best(available, size, must, topo.score)


def test_exact_up_to_sixteen_gpus_and_quick() -> None:
    rng = random.Random(7)
    ids = [f"GPU-{i:02d}" for i in range(16)]
    table = {frozenset(p): rng.choice([10, 20, 30, 40, 50, 60, 110, 220, 430, 1850]) for p in itertools.combinations(ids, 2)}

    def score(a: str, b: str) -> int:
        return 0 if a == b else table[frozenset((a, b))]

    for size, must in ((8, []), (5, ids[3:5]), (12, [ids[15]])):
        started = time.perf_counter()
        got = best_set(ids, size, score, must)
        elapsed = time.perf_counter() - started
        assert got is not None and set(must) <= set(got)
        assert set_score(got, score) == brute_best(ids, size, must, score)
        assert elapsed < 1.0, f"{size} of 16 took {elapsed:.2f}s"


def test_greedy_beyond_the_exact_limit_still_honours_must_include() -> None:
    ids = [f"GPU-{i:02d}" for i in range(topology.EXACT_LIMIT + 4)]
    got = best_set(ids, 6, lambda a, b: abs(ids.index(a) - ids.index(b)), [ids[5]])
    assert got is not None and len(got) == 6 and ids[5] in got


def test_impossible_requests_give_none() -> None:
    ids, topo = MACHINES["pcie_box"]
    assert best_set(ids[:2], 3, topo.score) is None
    assert best_set(ids[:2], 1, topo.score, ids[:2]) is None
    assert best_set(ids[:2], 2, topo.score, [ids[3]]) is None
    assert preferred(PreferredRequest(available=ids, size=0), topo.score) is None


def replicas_of(ids: list[str], n: int) -> list[str]:
    return [replica_id(u, i) for u in ids for i in range(n)]


def test_spread_replicas_over_the_best_connected_gpus() -> None:
    ids, topo = MACHINES["nvlink_pairs"]
    available = replicas_of(ids, 4)
    got = preferred(PreferredRequest(available=available, size=2), topo.score, ReplicaStrategy.SPREAD)
    assert got == [replica_id(ids[0], 0), replica_id(ids[1], 0)]
    got = preferred(PreferredRequest(available=replicas_of(ids[:2], 2), size=3), topo.score, ReplicaStrategy.SPREAD)
    assert got is not None and sorted(got) == sorted([replica_id(ids[0], 0), replica_id(ids[0], 1), replica_id(ids[1], 0)])


def test_pack_replicas_onto_as_few_gpus_as_hold_them() -> None:
    ids, topo = MACHINES["nvlink_pairs"]
    available = replicas_of(ids, 2)
    got = preferred(PreferredRequest(available=available, size=2), topo.score, ReplicaStrategy.PACK)
    assert got == [replica_id(ids[0], 0), replica_id(ids[0], 1)]
    got = preferred(PreferredRequest(available=available, size=3), topo.score, ReplicaStrategy.PACK)
    assert got is not None and {u.partition("::")[0] for u in got} == {ids[0], ids[1]}  # the NVLink pair
    # the GPU with more free replicas is used first
    lopsided = [replica_id(ids[6], 0), *replicas_of([ids[7]], 3)]
    got = preferred(PreferredRequest(available=lopsided, size=3), topo.score, ReplicaStrategy.PACK)
    assert got == replicas_of([ids[7]], 3)


@pytest.mark.parametrize("strategy", list(ReplicaStrategy))
def test_replica_must_include_is_honoured(strategy: ReplicaStrategy) -> None:
    ids, topo = MACHINES["nvlink_pairs"]
    available = replicas_of(ids, 2)
    must = [replica_id(ids[5], 1)]
    got = preferred(PreferredRequest(available=available, must_include=must, size=2), topo.score, strategy)
    assert got is not None and must[0] in got and len(got) == 2
    partners = {u.partition("::")[0] for u in got}
    assert partners == ({ids[5]} if strategy is ReplicaStrategy.PACK else {ids[4], ids[5]})


@settings(max_examples=100, deadline=None)
@given(data=st.data(), strategy=st.sampled_from(list(ReplicaStrategy)))
def test_replica_answers_are_always_valid(data: st.DataObject, strategy: ReplicaStrategy) -> None:
    ids, topo = MACHINES["nvswitch8"]
    available = data.draw(st.lists(st.sampled_from(replicas_of(ids, 3)), min_size=1, unique=True))
    size = data.draw(st.integers(1, len(available)))
    must = data.draw(st.lists(st.sampled_from(available), max_size=size, unique=True))
    got = preferred(PreferredRequest(available=available, must_include=must, size=size), topo.score, strategy)
    assert got is not None and len(got) == size == len(set(got))
    assert set(must) <= set(got) <= set(available)
    gpus_used = {u.partition("::")[0] for u in got}
    gpus_available = {u.partition("::")[0] for u in available}
    if strategy is ReplicaStrategy.SPREAD:
        must_gpus = {u.partition("::")[0] for u in must}
        assert len(gpus_used) == min(len(gpus_available), len(must_gpus) + size - len(must))


async def test_backend_offers_affinity_and_preference_for_its_own_resources(world: World, nv, sink) -> None:
    from cdiplug.models.devices import Device

    fake = FakeNvml.nvlink_pairs()
    res = nv.resources({"name": "nvidia.com/gpu"}, {"name": "nvidia.com/none", "options": {"selectors": [{"model": "*L4*"}]}})
    backend = nv.backend(res, nv.machine(world, fake))
    a, b, c = (g.uuid for g in fake.gpus[:3])
    async with nv.running(backend, sink):
        assert backend.affinity("nvidia.com/gpu", Device(id=f"{a}::1"), Device(id=f"{b}::0")) == 430.0
        assert backend.affinity("nvidia.com/gpu", Device(id=a), Device(id=c)) == 50.0
        snap = sink.latest["nvidia.com/gpu"]
        request = PreferredRequest(available=[c, b, a], size=2)
        assert sorted(backend.preferred_allocation("nvidia.com/gpu", snap, request) or []) == sorted([a, b])
        # a resource without GPUs (or unknown) leaves the choice to the core policy
        assert backend.preferred_allocation("nvidia.com/none", sink.latest["nvidia.com/none"], request) is None
        assert backend.preferred_allocation("example.com/other", snap, request) is None
