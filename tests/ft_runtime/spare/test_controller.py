from __future__ import annotations

import random

import networkx as nx
import pytest

from ft_runtime.spare import ReCtlr, StackedLayout, WipeOutError, min_stack


def _feasible(layout: StackedLayout, failed: set[int], stack: int) -> bool:
    """Independent check by max-flow: every type to a surviving holder with capacity S."""
    g = nx.DiGraph()
    for t in range(layout.n_groups):
        g.add_edge("s", ("t", t), capacity=1)
        for h in layout.holders(t):
            if h not in failed:
                g.add_edge(("t", t), ("g", h), capacity=1)
    for h in range(layout.n_groups):
        if h not in failed:
            g.add_edge(("g", h), "k", capacity=stack)
    return bool(nx.maximum_flow_value(g, "s", "k") == layout.n_groups)


def test_min_stack_is_ceiling_of_n_over_survivors() -> None:
    assert [min_stack(10, k) for k in (0, 1, 4, 5, 6, 9)] == [1, 2, 2, 2, 3, 10]
    with pytest.raises(ValueError, match=r"in \[0, N\)"):
        min_stack(10, 10)


@pytest.mark.timeout(240)  # seed 0 takes about 25 s of max-flow here
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_assignments_cover_every_type_once_at_the_minimal_stack(seed: int) -> None:
    layout = StackedLayout.build(40, 5)
    ctl = ReCtlr(layout)
    order = list(range(40))
    random.Random(seed).shuffle(order)
    failed: set[int] = set()
    last_stack = 1
    phases = set()
    for g in order:
        failed.add(g)
        if not _feasible(layout, failed, layout.redundancy):
            with pytest.raises(WipeOutError, match="restart from the last checkpoint"):
                ctl.fail([g])
            break
        a = ctl.fail([g])
        phases.add(a.phase)
        covered = sorted(t for ts in a.computes.values() for t in ts)
        assert covered == list(range(40))
        assert failed.isdisjoint(a.computes)
        for grp, ts in a.computes.items():
            assert set(ts) <= set(a.order[grp][: a.stack])
            assert sorted(a.order[grp]) == sorted(layout.stack(grp))
        assert a.stack >= max(last_stack, min_stack(40, len(failed)))
        # Minimal: one layer fewer (if still allowed by monotonicity) cannot cover all types.
        if a.stack > last_stack and a.stack > min_stack(40, len(failed)):
            assert not _feasible(layout, failed, a.stack - 1)
        if a.phase == "fixed":
            assert a.moves == 0
        last_stack = a.stack
    else:
        pytest.fail("40 failures of 40 groups never wiped out")
    assert "fixed" in phases


def test_reordering_uses_min_cost_flow_and_keeps_slots_that_need_not_move() -> None:
    layout = StackedLayout.build(7, 3)  # offsets (0, 1, 3): group g holds g, g+1, g+3
    ctl = ReCtlr(layout)
    a = ctl.fail([0, 1, 2])  # c(3) = 2, but type 1 is held only by group 5 at layer 2
    assert a.stack >= 2
    assert a.phase == "free"
    assert 0 < a.moves <= 4
    assert sorted(t for ts in a.computes.values() for t in ts) == list(range(7))


def test_reset_after_wipe_out_restores_stack_one() -> None:
    ctl = ReCtlr(StackedLayout.build(4, 2))
    ctl.fail([0])
    with pytest.raises(WipeOutError, match=r"shard type 0 lost every holder"):
        ctl.fail([3])  # type 0 is held by groups 0 and 3
    a = ctl.reset()
    assert a.stack == 1
    assert ctl.failed == frozenset()
    assert {g: ts for g, ts in a.computes.items()} == {0: (0,), 1: (1,), 2: (2,), 3: (3,)}


def test_unknown_group_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"group ids must be in \[0, 4\)"):
        ReCtlr(StackedLayout.build(4, 2)).fail([4])
