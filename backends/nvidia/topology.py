"""GPU topology: a pairwise score from NVLink and PCIe distance, and the best-connected set of GPUs.

Scores follow the reference NVIDIA allocator's scale: 100 per active NVLink between two GPUs
(links through an NVSwitch both GPUs reach count too: ``min`` of their links to that switch), plus
a PCIe score by the closest common ancestor: same board 60 > one switch 50 > several switches 40
> host bridge 30 > same CPU (NUMA node) 20 > across CPUs 10. NUMA comes in through the last two
and stands in for PCIe when NVML cannot say: same NUMA node 20, different 10, unknown 0.

:func:`best_set` finds the set of a given size with the highest total pairwise score, must-have
members included, exactly (branch and bound) for up to :data:`EXACT_LIMIT` candidates and greedily
beyond. :func:`preferred` maps a GetPreferredAllocation request onto GPUs, replicas included
(``spread``: as many GPUs as possible; ``pack``: as few), best-connected first.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Mapping, Sequence

from attrs import field, frozen

from cdiplug.sdk import PreferredRequest, underlying

from .discovery import Gpu
from .nvml import Nvml, NvmlError, PcieLevel
from .options import ReplicaStrategy

log = logging.getLogger(__name__)

EXACT_LIMIT = 16
NVLINK_SCORE = 100
PCIE_SCORE: Mapping[PcieLevel, int] = {
    PcieLevel.SAME_BOARD: 60,
    PcieLevel.SINGLE_SWITCH: 50,
    PcieLevel.MULTIPLE_SWITCHES: 40,
    PcieLevel.HOST_BRIDGE: 30,
    PcieLevel.SAME_CPU: 20,
    PcieLevel.ACROSS_CPUS: 10,
}


@frozen
class PairLink:
    """How two GPUs connect: the PCIe level (None: NVML could not say) and active NVLinks."""

    pcie: PcieLevel | None = None
    nvlinks: int = 0


@frozen
class Topology:
    """Links between the GPUs of a node, keyed by unordered UUID pair, and each GPU's NUMA node."""

    links: Mapping[frozenset[str], PairLink] = field(factory=dict)
    numa: Mapping[str, int | None] = field(factory=dict)

    def link(self, a: str, b: str) -> PairLink | None:
        return self.links.get(frozenset((a, b)))

    def score(self, a: str, b: str) -> int:
        """Higher is better connected; 0 for the same GPU or GPUs we know nothing about."""
        if a == b:
            return 0
        link = self.link(a, b)
        nvlinks = link.nvlinks if link else 0
        level = link.pcie if link else None
        if level is None:
            na, nb = self.numa.get(a), self.numa.get(b)
            if na is None or nb is None:
                return NVLINK_SCORE * nvlinks
            level = PcieLevel.SAME_CPU if na == nb else PcieLevel.ACROSS_CPUS
        return NVLINK_SCORE * nvlinks + PCIE_SCORE[level]


def read_topology(nvml: Nvml, gpus: Sequence[Gpu]) -> Topology:
    """Ask NVML how every pair of ``gpus`` (discovery's ``Gpu`` objects) connects. Blocking.

    A GPU whose links NVML cannot list counts as having none; a pair whose PCIe level it cannot
    give falls back to NUMA. Neither is fatal: topology only steers preferences.
    """
    remotes: dict[str, tuple[str, ...]] = {}
    for gpu in gpus:
        try:
            remotes[gpu.uuid] = nvml.nvlink_remotes(gpu.handle)
        except NvmlError as exc:
            log.warning("cannot list the NVLinks of GPU %s: %s", gpu.uuid, exc)
            remotes[gpu.uuid] = ()
    gpu_bus = {gpu.info.pci_bus_id for gpu in gpus}
    links: dict[frozenset[str], PairLink] = {}
    for a, b in itertools.combinations(gpus, 2):
        try:
            level: PcieLevel | None = nvml.common_ancestor(a.handle, b.handle)
        except NvmlError as exc:
            log.warning("cannot tell how GPUs %s and %s connect on PCIe: %s", a.uuid, b.uuid, exc)
            level = None
        ra, rb = remotes[a.uuid], remotes[b.uuid]
        direct = ra.count(b.info.pci_bus_id)  # a link is one link seen from either end; count one end
        # Links that end on the same non-GPU device (an NVSwitch) join the two GPUs through it.
        switched = sum(min(ra.count(s), rb.count(s)) for s in set(ra) & set(rb) if s not in gpu_bus)
        links[frozenset((a.uuid, b.uuid))] = PairLink(pcie=level, nvlinks=direct + switched)
    return Topology(links=links, numa={g.uuid: g.numa_node for g in gpus})


Score = Callable[[str, str], int]


def set_score(members: Sequence[str], score: Score) -> int:
    return sum(score(a, b) for a, b in itertools.combinations(members, 2))


def best_set(
    candidates: Sequence[str],
    size: int,
    score: Score,
    must_include: Sequence[str] = (),
    accept: Callable[[tuple[str, ...]], bool] | None = None,
) -> tuple[str, ...] | None:
    """The ``size`` candidates with the highest total pairwise score, ``must_include`` among them.

    Exact for up to EXACT_LIMIT candidates; ties go to the earliest candidates in the given order.
    ``accept`` rejects whole sets (capacity rules). None when no set fits.
    """
    cands = list(dict.fromkeys(candidates))
    must = list(dict.fromkeys(must_include))
    if size < len(must) or size > len(cands) or any(m not in cands for m in must):
        return None
    free = [c for c in cands if c not in must]
    need = size - len(must)
    if len(cands) > EXACT_LIMIT:
        return _greedy(free, must, need, score, accept)
    matrix = {(a, b): score(a, b) for a in cands for b in cands}
    base = set_score(must, score)
    best_score: int | None = None
    best_members: tuple[str, ...] | None = None

    def visit(start: int, chosen: list[str], current: int, gains: dict[str, int]) -> None:
        nonlocal best_score, best_members
        left = need - len(chosen)
        if left == 0:
            members = tuple(must + chosen)
            if (best_score is None or current > best_score) and (accept is None or accept(members)):
                best_score, best_members = current, members
            return
        pool = free[start:]
        if len(pool) < left:
            return
        if best_score is not None:
            top = sorted((gains[c] for c in pool), reverse=True)[:left]
            pair_max = max((matrix[a, b] for a, b in itertools.combinations(pool, 2)), default=0)
            if current + sum(top) + pair_max * left * (left - 1) // 2 <= best_score:
                return  # cannot beat (nor, on a tie, displace) the best set found so far
        for i in range(start, len(free) - left + 1):
            c = free[i]
            new_gains = {d: gains[d] + matrix[d, c] for d in free[i + 1 :]}
            visit(i + 1, [*chosen, c], current + gains[c], new_gains)

    visit(0, [], base, {c: sum(matrix[c, m] for m in must) for c in free})
    return best_members


def _greedy(
    free: list[str], must: list[str], need: int, score: Score, accept: Callable[[tuple[str, ...]], bool] | None
) -> tuple[str, ...] | None:
    """Beyond EXACT_LIMIT: grow the set one best-gaining member at a time (not exact)."""
    chosen = list(must)
    pool = list(free)
    if not chosen and need >= 2:
        a, b = max(itertools.combinations(pool, 2), key=lambda p: score(*p))
        chosen += [a, b]
        pool = [c for c in pool if c not in (a, b)]
    while len(chosen) < len(must) + need:
        c = max(pool, key=lambda c: sum(score(c, m) for m in chosen))
        chosen.append(c)
        pool.remove(c)
    members = tuple(chosen)
    return members if accept is None or accept(members) else None


def preferred(request: PreferredRequest, score: Score, strategy: ReplicaStrategy = ReplicaStrategy.SPREAD) -> list[str] | None:
    """The advertised IDs to prefer for one container, or None to leave it to the core policy.

    IDs may be replica IDs (``<uuid>::<i>``). ``spread`` uses as many GPUs as the request allows
    (each gets one replica before any gets two); ``pack`` as few as hold the request. Either way
    the GPUs chosen are the best-connected such set.
    """
    size = request.size
    available = list(dict.fromkeys(request.available))
    must = list(dict.fromkeys(request.must_include))
    if size <= 0 or size > len(available) or len(must) > size or any(m not in available for m in must):
        return None
    replicas: dict[str, list[str]] = {}
    for advertised in [*must, *(a for a in available if a not in must)]:
        replicas.setdefault(underlying(advertised), []).append(advertised)
    must_count: dict[str, int] = {}
    for m in must:
        must_count[underlying(m)] = must_count.get(underlying(m), 0) + 1
    gpus = list(replicas)
    must_gpus = list(must_count)

    if strategy is ReplicaStrategy.PACK:
        chosen = _pack_gpus(gpus, must_gpus, replicas, size, score)
    else:
        # every must GPU holds its must replicas; every other GPU chosen holds at least one
        extra = min(size - len(must), len(gpus) - len(must_gpus))
        chosen = best_set(gpus, len(must_gpus) + extra, score, must_gpus)
    if chosen is None:
        return None
    counts = {g: must_count.get(g, 0) for g in chosen}
    for g in chosen:
        counts[g] = max(counts[g], 1)
    left = size - sum(counts.values())
    if left < 0:
        return None
    order = list(chosen) if strategy is ReplicaStrategy.PACK else None
    while left > 0:
        spare = [g for g in chosen if counts[g] < len(replicas[g])]
        if not spare:
            return None
        # spread: the GPU holding the fewest so far; pack: fill the first GPU that still has room
        g = spare[0] if order is not None else min(spare, key=lambda g: counts[g])
        counts[g] += 1
        left -= 1
    return [rid for g in chosen for rid in replicas[g][: counts[g]]]


def _pack_gpus(
    gpus: list[str], must_gpus: list[str], replicas: Mapping[str, list[str]], size: int, score: Score
) -> tuple[str, ...] | None:
    """The fewest GPUs whose replicas hold ``size``, best-connected among those, fullest first."""
    by_room = sorted(gpus, key=lambda g: -len(replicas[g]))  # stable: ties keep request order

    def holds(members: tuple[str, ...]) -> bool:
        return sum(len(replicas[g]) for g in members) >= size

    for d in range(max(len(must_gpus), 1), len(gpus) + 1):
        found = best_set(by_room, d, score, must_gpus, accept=holds)
        if found is not None:
            return tuple(sorted(found, key=lambda g: (g not in must_gpus, -len(replicas[g]))))
    return None
