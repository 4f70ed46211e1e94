"""What a sequence of group failures does to each redundancy scheme, between two restarts.

Given the order in which groups fail, a scheme answers two questions: how many failures
it masks before a wipe-out, and the stack number (layers each survivor computes per step)
after each masked failure. SPARe's answer uses Hopcroft–Karp (scipy) on the real layout,
so the simulator and the Monte-Carlo see exactly what ReCtlr would decide.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import maximum_bipartite_matching

from ft_runtime.spare.layout import StackedLayout


class Scheme(Protocol):
    """A redundancy scheme over N groups."""

    n_groups: int
    members: np.ndarray  # the groups that take part in training (the others stand idle)

    def masked(self, order: np.ndarray) -> int:
        """How many failures of ``order`` are masked; the next one (if any) wipes out."""
        ...

    def stacks(self, order: np.ndarray, masked: int) -> np.ndarray:
        """Stack number after k = 0 … ``masked`` failures (length masked + 1)."""
        ...


def _positions(order: np.ndarray, n: int) -> np.ndarray:
    # Groups that never fail in this epoch sort after every failure.
    pos = np.full(n, n + 1, dtype=np.int64)
    pos[order] = np.arange(len(order))
    return pos


class NoRedundancy:
    """Checkpoint-only: every failure is a wipe-out."""

    def __init__(self, n_groups: int) -> None:
        self.n_groups = n_groups
        self.members = np.arange(n_groups)

    def masked(self, order: np.ndarray) -> int:
        return 0

    def stacks(self, order: np.ndarray, masked: int) -> np.ndarray:
        return np.ones(masked + 1, dtype=np.int64)


class Replication:
    """Traditional replication of degree r: ⌊N/r⌋ disjoint sets of exactly r groups.

    Every set holds one data shard r times and computes r layers per step; a wipe-out is
    the failure of a whole set. When r does not divide N, the N mod r leftover groups
    hold no replica and stand idle (a fourth copy in some sets would no longer be
    degree-r replication, and masks about 3 % of the wipe-outs at N = 200, r = 3).
    """

    def __init__(self, n_groups: int, redundancy: int) -> None:
        if not 1 <= redundancy <= n_groups:
            raise ValueError(f"need 1 <= r <= N, got r={redundancy}, N={n_groups}")
        self.n_groups, self.redundancy = n_groups, redundancy
        self.sets = n_groups // redundancy
        self.members = np.arange(self.sets * redundancy)
        self._set = self.members % self.sets

    def masked(self, order: np.ndarray) -> int:
        pos = _positions(order, self.n_groups)
        death = np.full(self.sets, -1, dtype=np.int64)
        np.maximum.at(death, self._set, pos[self.members])
        return int(min(death.min(), len(order)))

    def stacks(self, order: np.ndarray, masked: int) -> np.ndarray:
        return np.full(masked + 1, self.redundancy, dtype=np.int64)


class Spare:
    """SPARe on a stacked layout: a type dies with its last holder; S from HK feasibility."""

    def __init__(self, layout: StackedLayout) -> None:
        self.layout = layout
        self.n_groups = layout.n_groups
        self.members = np.arange(self.n_groups)
        self._holders = np.array([layout.holders(t) for t in range(self.n_groups)])
        self._edge_type = np.repeat(np.arange(self.n_groups), layout.redundancy)
        self._edge_group = self._holders.ravel()

    def masked(self, order: np.ndarray) -> int:
        pos = _positions(order, self.n_groups)
        return int(min(pos[self._holders].max(axis=1).min(), len(order)))

    def feasible(self, failed: np.ndarray, stack: int) -> bool:
        """Whether survivors computing ``stack`` layers (any order) can cover every type."""
        alive = np.ones(self.n_groups, dtype=bool)
        alive[failed] = False
        keep = alive[self._edge_group]
        rows = np.repeat(self._edge_type[keep], stack)
        cols = (self._edge_group[keep, None] * stack + np.arange(stack)).ravel()
        data = np.ones(len(rows), dtype=np.int8)
        graph = csr_matrix((data, (rows, cols)), shape=(self.n_groups, self.n_groups * stack))
        return bool((maximum_bipartite_matching(graph, perm_type="column") >= 0).all())

    def stacks(self, order: np.ndarray, masked: int) -> np.ndarray:
        # K[s] = the most failures (of this order) that stack s still covers; monotone in
        # both s and k, so a binary search per s needs only O(r log N) matchings.
        out = np.empty(masked + 1, dtype=np.int64)
        lo = 0
        for s in range(1, self.layout.redundancy + 1):
            hi = masked
            if s < self.layout.redundancy:
                a, b = lo, masked
                while a < b:
                    mid = (a + b + 1) // 2
                    if self.feasible(order[:mid], s):
                        a = mid
                    else:
                        b = mid - 1
                hi = a
            out[lo : hi + 1] = s
            lo = max(lo, hi + 1)
            if lo > masked:
                break
        return out


def monte_carlo(
    scheme: Scheme, trials: int, seed: int = 0, *, stacks: bool = True
) -> tuple[float, float]:
    """Mean failures masked per wipe-out and mean stack number over the masked failures.

    Failure orders are uniform random permutations of the scheme's members (i.i.d.
    failure times; idle groups do not take part). With
    ``stacks=False`` only the masked count is computed (much faster); the stack mean is NaN.
    """
    rng = np.random.default_rng(seed)
    masked, stack = [], []
    for _ in range(trials):
        order = rng.permutation(scheme.members)
        m = scheme.masked(order)
        masked.append(m)
        if stacks:
            stack.append(float(scheme.stacks(order, m)[: max(m, 1)].mean()))
    return float(np.mean(masked)), float(np.mean(stack)) if stacks else float("nan")
