"""SPARe's stacked layout: N groups, each holding a stack of r data shard types.

Layer ``l`` of group ``i`` holds shard type ``(i + s_l) mod N``. The offsets ``s_l`` form a
modular Sidon set (all pairwise differences distinct mod N), which is what makes any two
shard types share at most one group (SPARe's independence condition, Thm 4.1). A
consecutive window of offsets would break it: neighbouring types would share r - 1 groups,
and the endurable failure count would come out about 7 % above the closed form.

>>> layout = StackedLayout.build(n_groups=7, redundancy=3)
>>> layout.offsets
(0, 1, 3)
>>> layout.stack(0), layout.holders(3)
((0, 1, 3), (3, 2, 0))
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from itertools import combinations

from ft_runtime.spare.errors import LayoutError


def sidon_offsets(n_groups: int, redundancy: int) -> tuple[int, ...]:
    """Greedy offsets whose pairwise differences are all distinct modulo ``n_groups``.

    Args:
        n_groups: N, the number of groups (and of shard types).
        redundancy: r, the number of offsets wanted (the stack depth).

    Returns:
        r offsets in increasing order, starting at 0.

    Raises:
        LayoutError: if no such set is found; r·(r−1) must be at most N − 1.
    """
    if redundancy < 1 or n_groups < redundancy:
        raise LayoutError(
            f"need 1 <= redundancy <= n_groups, got redundancy={redundancy}, n_groups={n_groups}"
        )
    offsets = [0]
    used: set[int] = set()
    for cand in range(1, n_groups):
        if len(offsets) == redundancy:
            break
        diffs = {(cand - s) % n_groups for s in offsets} | {(s - cand) % n_groups for s in offsets}
        # A new offset must add 2·len(offsets) fresh differences, none repeated among themselves.
        if len(diffs) == 2 * len(offsets) and not diffs & used and 0 not in diffs:
            offsets.append(cand)
            used |= diffs
    if len(offsets) < redundancy:
        raise LayoutError(
            f"no distinct-difference offsets of size {redundancy} found modulo {n_groups}; "
            f"use fewer shards per group (r·(r−1) must be at most N − 1) or more groups"
        )
    return tuple(offsets)


@dataclass(frozen=True, slots=True)
class StackedLayout:
    """The static stacked layout, verified on construction.

    Attributes:
        n_groups: N, the number of data-parallel groups and of shard types.
        offsets: r per-layer offsets; layer l of group i holds type (i + offsets[l]) mod N.
    """

    n_groups: int
    offsets: tuple[int, ...]

    def __post_init__(self) -> None:
        self.verify()

    @classmethod
    def build(cls, n_groups: int, redundancy: int) -> StackedLayout:
        """The layout with greedy Sidon offsets for N groups and stacks of depth r."""
        return cls(n_groups, sidon_offsets(n_groups, redundancy))

    @property
    def n_shards(self) -> int:
        """Number of shard types: one per group."""
        return self.n_groups

    @property
    def redundancy(self) -> int:
        """r: the stack depth, and how many groups hold each shard type."""
        return len(self.offsets)

    def stack(self, group: int) -> tuple[int, ...]:
        """Shard types of ``group``'s stack, top layer first."""
        return tuple((group + s) % self.n_groups for s in self.offsets)

    def holders(self, shard: int) -> tuple[int, ...]:
        """Groups holding shard type ``shard``, in layer order."""
        return tuple((shard - s) % self.n_groups for s in self.offsets)

    def verify(self) -> None:
        """Check every type is held by r distinct groups and no pair shares two groups.

        Raises:
            LayoutError: naming the first violation found.
        """
        n, r = self.n_groups, len(self.offsets)
        if n < 1 or r < 1 or r > n:
            raise LayoutError(f"need 1 <= r <= N, got r={r}, N={n}")
        counts = Counter(t for g in range(n) for t in set(self.stack(g)))
        short = [t for t in range(n) if counts[t] != r]
        if short or any(len(set(self.stack(g))) != r for g in range(n)):
            raise LayoutError(f"offsets {self.offsets} repeat a type within a stack mod {n}")
        pairs = Counter(pair for g in range(n) for pair in combinations(sorted(self.stack(g)), 2))
        twice = [pair for pair, c in pairs.items() if c > 1]
        if twice:
            raise LayoutError(
                f"offsets {self.offsets} put shard types {twice[0]} together in "
                f"{pairs[twice[0]]} groups; use distinct-difference offsets (sidon_offsets)"
            )
