"""ReCtlr: after group failures, decide who computes which shard type and at what stack.

Three phases, as in SPARe: Hopcroft–Karp on the current stack order at the lowest stack
number allowed (no data moves); if that fails, Hopcroft–Karp with free permutations within
each survivor's stack, raising the stack number until a perfect matching exists; then a
min-cost matching (min-cost max-flow on the unit-capacity graph) for the reordering that
reaches that stack number with the fewest moves.
No perfect matching even at S = r is a wipe-out: the job restarts from its checkpoint.

>>> from ft_runtime.spare.layout import StackedLayout
>>> ctl = ReCtlr(StackedLayout.build(4, 2))
>>> a = ctl.fail([2])
>>> a.stack, sorted(a.computes)
(2, [0, 1, 3])
>>> sorted(t for ts in a.computes.values() for t in ts)
[0, 1, 2, 3]
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from ft_runtime.spare.errors import WipeOutError
from ft_runtime.spare.layout import StackedLayout
from ft_runtime.spare.matching import hopcroft_karp, min_cost_matching


def min_stack(n_groups: int, failed: int) -> int:
    """c(k) = ⌈N / (N − k)⌉: the least stack number that N − k survivors can cover N types with."""
    if not 0 <= failed < n_groups:
        raise ValueError(f"failed groups must be in [0, N), got {failed} of {n_groups}")
    return math.ceil(n_groups / (n_groups - failed))


@dataclass(frozen=True, slots=True)
class Assignment:
    """Who computes what in the next step.

    Attributes:
        stack: S, how many top layers each survivor computes.
        computes: surviving group -> the shard types whose gradient it contributes; every
            type appears exactly once, so Σ contributions / N is the fault-free gradient.
        order: surviving group -> its committed stack order, top first.
        phase: "fixed" (matched on the current order), "free" (reordered by min-cost flow).
        moves: how many shard types moved into a slot that held another type.
        failed: the failed groups this assignment works around.
    """

    stack: int
    computes: Mapping[int, tuple[int, ...]]
    order: Mapping[int, tuple[int, ...]]
    phase: str
    moves: int = 0
    failed: frozenset[int] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        object.__setattr__(self, "computes", MappingProxyType(dict(self.computes)))
        object.__setattr__(self, "order", MappingProxyType(dict(self.order)))


class ReCtlr:
    """The reordering controller for one stacked layout.

    State: the failed groups, the stack number S (never lowered until a restart) and each
    survivor's stack order. ``fail`` adds failures and returns the new assignment;
    ``reset`` is the restart from checkpoint (all groups back, S = 1, the static layout).
    """

    def __init__(self, layout: StackedLayout) -> None:
        self.layout = layout
        n = layout.n_groups
        self._static = np.array([layout.stack(g) for g in range(n)], dtype=np.int64)
        self._holders = np.array([layout.holders(t) for t in range(n)], dtype=np.int64)
        self._dead = np.zeros(n, dtype=bool)
        self._stack = 1
        self._order = self._static.copy()
        self.reset()

    @property
    def failed(self) -> frozenset[int]:
        return frozenset(int(g) for g in np.flatnonzero(self._dead))

    @property
    def stack(self) -> int:
        return self._stack

    def reset(self) -> Assignment:
        """Forget failures (the groups were replaced by a restart) and return the S = 1 plan."""
        self._dead[:] = False
        self._stack = 1
        self._order = self._static.copy()
        survivors = np.arange(self.layout.n_groups)
        return self._commit(survivors, 1, self._order[:, 0], "fixed", 0)

    def fail(self, groups: Iterable[int]) -> Assignment:
        """Record failed groups and plan the step around them.

        Raises:
            WipeOutError: some shard type has no surviving holder (restart from checkpoint).
            ValueError: a group id outside [0, N).
        """
        n = self.layout.n_groups
        new = sorted(set(groups))
        if any(not 0 <= g < n for g in new):
            raise ValueError(f"group ids must be in [0, {n}), got {new}")
        self._dead[new] = True
        k = int(self._dead.sum())
        if k >= n or self._dead_shard() is not None:
            raise WipeOutError(self._wipe_message())
        survivors = np.flatnonzero(~self._dead)
        lowest = max(self._stack, min_stack(n, k))
        return self._fixed(survivors, lowest) or self._free(survivors, lowest)

    def _fixed(self, survivors: np.ndarray, stack: int) -> Assignment | None:
        # Slot i·S + l of survivor i holds exactly one type: its current layer l.
        rows = self._order[survivors, :stack].ravel()
        n_cols = len(survivors) * stack
        match = hopcroft_karp(self.layout.n_shards, n_cols, rows, np.arange(n_cols))
        if match is None:
            return None
        return self._commit(survivors, stack, match, "fixed", 0)

    def _free(self, survivors: np.ndarray, lowest: int) -> Assignment:
        r, m = self.layout.redundancy, len(survivors)
        for stack in range(lowest, r + 1):
            # Any of a survivor's r types may move into any of its top-S slots.
            layer = np.tile(np.arange(stack), r)  # slot layer of each (type j, slot l) pair
            src = np.repeat(np.arange(r), stack)  # the type's current layer j
            rows = np.repeat(self._order[survivors], stack, axis=1).ravel()
            cols = (np.arange(m)[:, None] * stack + layer[None, :]).ravel()
            cost = np.broadcast_to(layer != src, (m, r * stack)).ravel().astype(np.int64)
            n_cols = m * stack
            if hopcroft_karp(self.layout.n_shards, n_cols, rows, cols) is None:
                continue
            match, moves = min_cost_matching(self.layout.n_shards, n_cols, rows, cols, cost)
            self._reorder(survivors, stack, match)
            return self._commit(survivors, stack, match, "free", moves)
        raise WipeOutError(self._wipe_message())  # unreachable while every type has a holder

    def _reorder(self, survivors: np.ndarray, stack: int, match: np.ndarray) -> None:
        groups, layers = survivors[match // stack], match % stack
        moved = set(groups[self._order[groups, layers] != np.arange(len(match))].tolist())
        placed: dict[int, dict[int, int]] = {}
        for t, (g, layer) in enumerate(zip(groups.tolist(), layers.tolist(), strict=True)):
            if g in moved:
                placed.setdefault(g, {})[layer] = t
        for g, top in placed.items():
            old = [int(t) for t in self._order[g]]
            new: list[int | None] = [top.get(layer) for layer in range(len(old))]
            rest = [t for t in old if t not in top.values()]
            for layer, cur in enumerate(new):
                # Keep an unplaced type where it was; only then fill gaps in the old order.
                if cur is None and old[layer] in rest:
                    new[layer] = old[layer]
                    rest.remove(old[layer])
            fill = iter(rest)
            self._order[g] = [t if t is not None else next(fill) for t in new]

    def _commit(
        self, survivors: np.ndarray, stack: int, match: np.ndarray, phase: str, moves: int
    ) -> Assignment:
        """``match[t]`` is the slot i·S + l computing type t."""
        self._stack = stack
        owner = survivors[np.asarray(match) // stack]
        computes: dict[int, list[int]] = {int(g): [] for g in survivors}
        for t, g in enumerate(owner.tolist()):
            computes[g].append(t)
        order = {int(g): tuple(int(t) for t in self._order[g]) for g in survivors}
        comp = {g: tuple(ts) for g, ts in computes.items()}
        return Assignment(stack, comp, order, phase, moves, self.failed)

    def _dead_shard(self) -> int | None:
        dead = np.flatnonzero(self._dead[self._holders].all(axis=1))
        return int(dead[0]) if len(dead) else None

    def _wipe_message(self) -> str:
        dead = self._dead_shard()
        failed = sorted(self.failed)
        return (
            f"wipe-out: shard type {dead} lost every holder after {len(failed)} failed "
            f"groups {failed}; restart from the last checkpoint"
        )
