from __future__ import annotations

from collections import Counter
from itertools import combinations

import pytest

from ft_runtime.spare import LayoutError, StackedLayout, sidon_offsets


@pytest.mark.parametrize(("n", "r"), [(4, 2), (7, 3), (50, 5), (200, 9), (1000, 9)])
def test_every_type_has_r_holders_and_pairs_share_at_most_one_group(n: int, r: int) -> None:
    layout = StackedLayout.build(n, r)
    holders = Counter(t for g in range(n) for t in layout.stack(g))
    assert set(holders.values()) == {r}
    pairs = Counter(p for g in range(n) for p in combinations(sorted(layout.stack(g)), 2))
    assert max(pairs.values()) == 1
    for t in range(0, n, max(1, n // 10)):
        assert all(t in layout.stack(g) for g in layout.holders(t))


def test_consecutive_offsets_are_rejected_with_the_offending_pair() -> None:
    with pytest.raises(LayoutError, match=r"put shard types \(\d+, \d+\) together in 2 groups"):
        StackedLayout(10, (0, 1, 2))


def test_repeated_offset_modulo_n_is_rejected() -> None:
    with pytest.raises(LayoutError, match="repeat a type"):
        StackedLayout(5, (0, 5))


def test_too_many_offsets_for_n_is_a_clear_error() -> None:
    with pytest.raises(LayoutError, match=r"r·\(r−1\) must be at most N − 1"):
        sidon_offsets(6, 3)
    with pytest.raises(LayoutError, match="redundancy <= n_groups"):
        sidon_offsets(3, 4)


def test_offsets_have_distinct_differences_modulo_n() -> None:
    offsets = sidon_offsets(101, 8)
    diffs = [(a - b) % 101 for a in offsets for b in offsets if a != b]
    assert len(diffs) == len(set(diffs)) == 8 * 7
