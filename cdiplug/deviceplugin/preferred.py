"""The core policy for GetPreferredAllocation: which devices to suggest for one container.

The kubelet offers the free devices (``available``), those the container must get anyway
(``must_include``) and how many it needs (``size``). The answer is ``must_include`` (deduplicated,
in the kubelet's order) followed by the chosen others, sorted by ID. Rules, in order:

1. **must_include first, all of it**, even when that breaks every rule below, even when it holds
   more than ``size`` IDs or IDs that are not in ``available``. The others are drawn from
   ``available`` minus ``must_include`` (duplicates ignored), ``size - len(must_include)`` of
   them; when fewer are free, all of them. So the answer has exactly ``size`` IDs whenever the
   request can be met, and otherwise the most it can, always the same for the same input.
2. **Fewest NUMA nodes spanned** by the whole answer (must_include too). A device on several
   nodes spans all of them; devices without NUMA information (and IDs the snapshot does not know)
   all count as one more node, "unknown".
3. **Packing**: among answers spanning equally few nodes, the one whose nodes hold the fewest free
   devices in total, where a node's free devices are those of ``available`` and ``must_include``
   on it. Put the other way round: the answer leaves as many free devices as possible on nodes it
   does not touch at all, which keeps whole nodes free for later large requests (best fit).
4. **Highest affinity**: the sum of the backend's pairwise affinity over every pair of devices in
   the answer (``PairwiseAffinity``; higher is better, 0 neutral). Scores are compared exactly,
   as floats summed in a fixed order.
5. **Spread over distinct underlying devices**: with replicas (``<id>::<i>``), the answer that
   holds the most different real devices, so shared containers land on different hardware when
   rules 2-4 do not decide. (A backend that wants replicas packed instead, NVIDIA's say, answers
   with its own ``PreferredAllocator``.)
6. **Lowest IDs**: the answer whose sorted ID list is lexicographically smallest (Python string
   order). So the answer is deterministic.

Exactness: rules 2-3 are solved exactly by trying sets of NUMA nodes, smallest first, as long as
no more than :data:`NODE_SET_LIMIT` sets need trying (always with up to 12 nodes), else greedily
(add the node that makes the request fit with the fewest free devices, or else the one that
makes the most devices usable). Rules 5-6 without affinity are always exact (a linear greedy
that is provably optimal). With a non-zero affinity, rules 4-6 are exact when the candidate sets
number at most :data:`EXACT_LIMIT` (8 GPUs choose 4 is 70), else greedy: start from
must_include, or from the best pair when there is none, then add the device with the highest
affinity to those already chosen, then a new underlying device, then the lowest ID. Affinity is
weighed only while the candidates are at most :data:`AFFINITY_LIMIT` different underlying
devices (it is about GPUs, of which a node has few): scoring every pair of more would stall the
one event loop every resource shares; beyond it, rules 5-6 decide.

Boundary: this module sees IDs as advertised and a snapshot for their NUMA nodes; it never calls a
backend itself: the allocator passes affinity and the replica mapping in as functions.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from math import comb

from cdiplug.models.devices import DeviceSnapshot, PreferredRequest

UNKNOWN_NODE = -1  # the one "node" every device without NUMA information is on
NODE_SET_LIMIT = 4096
EXACT_LIMIT = 5000
AFFINITY_LIMIT = 128

Affinity = Callable[[str, str], float]
"""Affinity of two underlying device IDs, called with ``a < b`` and never with ``a == b``."""


def preferred_allocation(
    request: PreferredRequest,
    snapshot: DeviceSnapshot,
    affinity: Affinity | None = None,
    underlying: Callable[[str], str] | None = None,
) -> tuple[str, ...]:
    """The suggested IDs for one container request (see the module docstring for the rules)."""
    must = tuple(dict.fromkeys(request.must_include))
    if request.size <= len(must):
        return must
    must_set = set(must)
    rest = sorted(set(request.available) - must_set)
    k = request.size - len(must)
    if k >= len(rest):
        return must + tuple(rest)
    under = underlying or _identity
    policy = _Policy(nodes_by_device(snapshot), must, rest, under, affinity)
    return must + tuple(policy.choose(k))


_UNKNOWN = frozenset((UNKNOWN_NODE,))


def nodes_by_device(snapshot: DeviceSnapshot) -> dict[str, frozenset[int]]:
    """The NUMA nodes of every device as a set, ``{UNKNOWN_NODE}`` when unknown (one set object
    per distinct set): what the policy needs of a snapshot, made once per snapshot."""
    shared: dict[tuple[int, ...], frozenset[int]] = {(): _UNKNOWN}
    out: dict[str, frozenset[int]] = {}
    for device in snapshot.devices:
        numa = device.numa_nodes
        nodes = shared.get(numa)
        if nodes is None:
            nodes = shared[numa] = frozenset(numa)
        out[device.id] = nodes
    return out


def _identity(device_id: str) -> str:
    return device_id


class _Policy:
    def __init__(
        self,
        node_sets: Mapping[str, frozenset[int]],
        must: tuple[str, ...],
        rest: list[str],
        underlying: Callable[[str], str],
        affinity: Affinity | None,
    ) -> None:
        self.must = must
        self.rest = rest
        self._underlying_of = underlying
        self._underlying: dict[str, str] = {}
        self.affinity = affinity
        self._pairs: dict[tuple[str, str], float] = {}
        get = node_sets.get
        self.nodes: dict[str, frozenset[int]] = {i: get(i, _UNKNOWN) for i in (*must, *rest)}
        counts = collections.Counter(self.nodes.values())  # devices per distinct node set
        self.free: dict[int, int] = {}
        for node_set, count in counts.items():
            for node in node_set:
                self.free[node] = self.free.get(node, 0) + count
        # The free, not-yet-included devices by the exact set of nodes they span, in ID order.
        self.by_node_set: dict[frozenset[int], list[str]] = {}
        for device_id in rest:
            self.by_node_set.setdefault(self.nodes[device_id], []).append(device_id)

    def underlying(self, device_id: str) -> str:
        u = self._underlying.get(device_id)
        if u is None:
            u = self._underlying[device_id] = self._underlying_of(device_id)
        return u

    # -- rules 2 and 3: which NUMA nodes --------------------------------------------------------

    def _usable(self, nodes: frozenset[int]) -> int:
        return sum(len(ids) for node_set, ids in self.by_node_set.items() if node_set <= nodes)

    def _packing(self, nodes: Iterable[int]) -> int:
        return sum(self.free[n] for n in nodes)

    def node_sets(self, k: int) -> list[frozenset[int]]:
        """Every set of nodes that is optimal by rules 2-3 (exact), or the greedy one."""
        base = frozenset(n for device_id in self.must for n in self.nodes[device_id])
        others = sorted(set(self.free) - base)
        tried = 0
        for extra in range(len(others) + 1):
            tried += comb(len(others), extra)
            if tried > NODE_SET_LIMIT:
                return [self._greedy_node_set(base, others, k)]
            best: list[frozenset[int]] = []
            best_packing = 0
            for combo in itertools.combinations(others, extra):
                nodes = base.union(combo)
                if self._usable(nodes) < k:
                    continue
                packing = self._packing(nodes)
                if not best or packing < best_packing:
                    best, best_packing = [nodes], packing
                elif packing == best_packing:
                    best.append(nodes)
            if best:
                return best
        raise AssertionError("unreachable: every node together holds more than k free devices")

    def _greedy_node_set(self, base: frozenset[int], others: list[int], k: int) -> frozenset[int]:
        nodes = base
        while self._usable(nodes) < k:
            left = [n for n in others if n not in nodes]
            fitting = [n for n in left if self._usable(nodes | {n}) >= k]
            if fitting:
                return nodes | {min(fitting, key=lambda n: (self.free[n], n))}
            nodes = nodes | {max(left, key=lambda n: (self._usable(nodes | {n}), self.free[n], -n))}
        return nodes

    def candidates(self, nodes: frozenset[int]) -> list[str]:
        return sorted(i for node_set, ids in self.by_node_set.items() if node_set <= nodes for i in ids)

    # -- rules 4 to 6: which devices on those nodes -----------------------------------------

    def choose(self, k: int) -> list[str]:
        pools = [self.candidates(nodes) for nodes in self.node_sets(k)]
        weigh = self.affinity is not None and self._weigh_affinity(pools)
        if weigh:
            if sum(comb(len(pool), k) for pool in pools) <= EXACT_LIMIT:
                picks = [self._exact_affinity(pool, k) for pool in pools]
            else:
                picks = [self._greedy_affinity(pool, k) for pool in pools]
        else:
            picks = [self._spread_lowest(pool, k) for pool in pools]
        if len(picks) == 1:
            return picks[0]
        # Smaller is better: rules 4, 5 and 6 for sorted lists of picks.
        return min(picks, key=lambda p: (-self._score(p) if weigh else 0.0, -self._distinct(p), p))

    def _distinct(self, picks: Sequence[str]) -> int:
        return len({self.underlying(i) for i in (*self.must, *picks)})

    def _pair(self, a: str, b: str) -> float:
        ua, ub = self.underlying(a), self.underlying(b)
        if ua == ub or self.affinity is None:
            return 0.0
        key = (ua, ub) if ua < ub else (ub, ua)
        score = self._pairs.get(key)
        if score is None:
            score = self._pairs[key] = float(self.affinity(*key))
        return score

    def _score(self, picks: Sequence[str]) -> float:
        chosen = (*self.must, *picks)
        return sum(self._pair(a, b) for a, b in itertools.combinations(chosen, 2))

    def _weigh_affinity(self, pools: list[list[str]]) -> bool:
        """Whether affinity takes part: few enough devices, and any pair that could be chosen
        scores non-zero (else rules 5-6 decide alone, exactly)."""
        ids = sorted({self.underlying(i): i for i in (*self.must, *itertools.chain.from_iterable(pools))}.values())
        if len(ids) > AFFINITY_LIMIT:
            return False
        return any(self._pair(a, b) != 0.0 for a, b in itertools.combinations(ids, 2))

    def _exact_affinity(self, pool: list[str], k: int) -> list[str]:
        # Scores per underlying device (at most AFFINITY_LIMIT of them), not per replica ID.
        devices = sorted({self.underlying(x) for x in pool})
        index = {u: i for i, u in enumerate(devices)}
        first = {u: x for x in reversed(pool) for u in (self.underlying(x),)}
        matrix = [[self._pair(first[u], first[v]) for v in devices] for u in devices]
        under = [index[self.underlying(x)] for x in pool]
        to_must = [sum(self._pair(x, m) for m in self.must) for x in pool]
        must_under = {self.underlying(m) for m in self.must}
        best: tuple[float, int] | None = None
        best_combo: tuple[int, ...] = ()
        # Combinations come in lexicographic order of the (sorted) pool: on a tie the first wins.
        for combo in itertools.combinations(range(len(pool)), k):
            score = 0.0
            for pos, i in enumerate(combo):
                score += to_must[i]
                row = matrix[under[i]]
                for j in combo[:pos]:
                    score += row[under[j]]
            key = (score, len(must_under.union(devices[under[i]] for i in combo)))
            if best is None or key > best:
                best, best_combo = key, combo
        return [pool[i] for i in best_combo]

    def _greedy_affinity(self, pool: list[str], k: int) -> list[str]:
        chosen: list[str] = []
        used = {self.underlying(m) for m in self.must}
        gain = {x: sum(self._pair(x, m) for m in self.must) for x in pool}
        left = list(pool)  # sorted: max() keeps the first of equals, the lowest ID

        def take(pick: str) -> None:
            left.remove(pick)
            chosen.append(pick)
            used.add(self.underlying(pick))
            for x in left:
                gain[x] += self._pair(x, pick)

        if not self.must and k >= 2:
            # Nothing to be near yet: start from the best pair rather than from the lowest ID,
            # looking at the lowest ID of each underlying device only (replicas score alike).
            firsts = list({self.underlying(x): x for x in reversed(pool)}.values())
            firsts.sort()
            if len(firsts) >= 2:
                for x in max(itertools.combinations(firsts, 2), key=lambda p: self._pair(*p)):
                    take(x)
        while len(chosen) < k:
            take(max(left, key=lambda x: (gain[x], self.underlying(x) not in used)))
        return sorted(chosen)

    def _spread_lowest(self, pool: list[str], k: int) -> list[str]:
        """The lowest sorted IDs among the picks with the most distinct underlying devices.

        Walk the IDs in order and take each one unless that makes the best spread unreachable:
        what is left can still reach it iff enough IDs remain and enough not-yet-used underlying
        devices remain among them. Taking the smallest feasible ID each time gives the
        lexicographically smallest answer.
        """
        if self._underlying_of is _identity:
            return pool[:k]  # no replicas: every ID is a device of its own, so the lowest IDs
        under = [self.underlying(x) for x in pool]
        used = {self.underlying(m) for m in self.must}
        remaining: dict[str, int] = {}
        for u in under:
            remaining[u] = remaining.get(u, 0) + 1
        new_left = sum(1 for u in remaining if u not in used)  # unused underlying devices ahead
        need = min(k, new_left)  # new underlying devices the answer must still add
        slots = k
        picks: list[str] = []
        for i, (x, u) in enumerate(zip(pool, under)):
            if slots == 0:
                break
            remaining[u] -= 1
            is_new = u not in used
            if is_new and remaining[u] == 0:
                new_left -= 1  # x was the last of u ahead
            ids_left = len(pool) - i - 1
            if is_new:
                after_new_left = new_left - (1 if remaining[u] > 0 else 0)
                ok = ids_left >= slots - 1 and after_new_left >= need - 1
            else:
                ok = ids_left >= slots - 1 and new_left >= need and slots - 1 >= need
            if ok:
                picks.append(x)
                slots -= 1
                if is_new:
                    used.add(u)
                    need -= 1
                    new_left = after_new_left
        return picks
