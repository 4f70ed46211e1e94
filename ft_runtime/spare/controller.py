"""ReCtlr: after group failures, decide who computes which shard type and at what stack.

Three phases, as in SPARe: Hopcroft–Karp on the current stack order at the lowest stack
number allowed (no data moves); if that fails, Hopcroft–Karp with free permutations within
each survivor's stack, raising the stack number until a perfect matching exists; then
min-cost max-flow for the reordering that reaches that stack number with the fewest moves.
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

from ft_runtime.spare.errors import WipeOutError
from ft_runtime.spare.layout import StackedLayout
from ft_runtime.spare.matching import Slot, hopcroft_karp, min_cost_assignment, slots


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
        moves: how many stack slots changed their shard type.
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
        self._failed: set[int] = set()
        self._stack = 1
        self._order: dict[int, tuple[int, ...]] = {}
        self.reset()

    @property
    def failed(self) -> frozenset[int]:
        return frozenset(self._failed)

    @property
    def stack(self) -> int:
        return self._stack

    def reset(self) -> Assignment:
        """Forget failures (the groups were replaced by a restart) and return the S = 1 plan."""
        n = self.layout.n_groups
        self._failed.clear()
        self._stack = 1
        self._order = {g: self.layout.stack(g) for g in range(n)}
        computes = {g: (self._order[g][0],) for g in range(n)}
        return Assignment(1, computes, self._order, "fixed")

    def fail(self, groups: Iterable[int]) -> Assignment:
        """Record failed groups and plan the step around them.

        Raises:
            WipeOutError: some shard type has no surviving holder (restart from checkpoint).
            ValueError: a group id outside [0, N).
        """
        n = self.layout.n_groups
        new = set(groups)
        if any(not 0 <= g < n for g in new):
            raise ValueError(f"group ids must be in [0, {n}), got {sorted(new)}")
        self._failed |= new
        if len(self._failed) >= n or self._dead_shard() is not None:
            raise WipeOutError(self._wipe_message())
        survivors = [g for g in range(n) if g not in self._failed]
        lowest = max(self._stack, min_stack(n, len(self._failed)))
        return self._fixed(survivors, lowest) or self._free(survivors, lowest)

    def _fixed(self, survivors: list[int], stack: int) -> Assignment | None:
        cols = slots(survivors, stack)
        allowed = {(g, layer): (self._order[g][layer],) for g, layer in cols}
        match = hopcroft_karp(self.layout.n_shards, cols, allowed)
        if match is None:
            return None
        return self._commit(match, stack, "fixed", 0)

    def _free(self, survivors: list[int], lowest: int) -> Assignment:
        holds = {g: self._order[g] for g in survivors}
        for stack in range(lowest, self.layout.redundancy + 1):
            cols = slots(survivors, stack)
            allowed = {(g, layer): holds[g] for g, layer in cols}
            if hopcroft_karp(self.layout.n_shards, cols, allowed) is not None:
                match, moves = min_cost_assignment(self.layout.n_shards, cols, holds, self._order)
                self._reorder(match, stack)
                return self._commit(match, stack, "free", moves)
        raise WipeOutError(self._wipe_message())  # unreachable while every type has a holder

    def _reorder(self, match: Mapping[int, Slot], stack: int) -> None:
        placed: dict[int, dict[int, int]] = {}
        for t, (g, layer) in match.items():
            placed.setdefault(g, {})[layer] = t
        for g, top in placed.items():
            old = self._order[g]
            new: list[int | None] = [top.get(layer) for layer in range(len(old))]
            rest = [t for t in old if t not in top.values()]
            for layer, cur in enumerate(new):
                # Keep an unplaced type where it was; only then fill gaps in the old order.
                if cur is None and old[layer] in rest:
                    new[layer] = old[layer]
                    rest.remove(old[layer])
            fill = iter(rest)
            self._order[g] = tuple(t if t is not None else next(fill) for t in new)

    def _commit(self, match: Mapping[int, Slot], stack: int, phase: str, moves: int) -> Assignment:
        self._stack = stack
        computes: dict[int, list[int]] = {g: [] for g in self._order if g not in self._failed}
        for t, (g, _layer) in sorted(match.items()):
            computes[g].append(t)
        order = {g: self._order[g] for g in computes}
        comp = {g: tuple(ts) for g, ts in computes.items()}
        return Assignment(stack, comp, order, phase, moves, frozenset(self._failed))

    def _dead_shard(self) -> int | None:
        for t in range(self.layout.n_shards):
            if all(g in self._failed for g in self.layout.holders(t)):
                return t
        return None

    def _wipe_message(self) -> str:
        dead = self._dead_shard()
        return (
            f"wipe-out: shard type {dead} lost every holder after {len(self._failed)} failed "
            f"groups {sorted(self._failed)}; restart from the last checkpoint"
        )
