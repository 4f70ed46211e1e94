from __future__ import annotations

import numpy as np
import pytest

from ft_runtime.planner.epochs import NoRedundancy, Replication, Spare, monte_carlo
from ft_runtime.planner.spare_math import (
    c,
    mu,
    mu_replication,
    r_star,
    sbar_lower,
    ttt_ratio,
)
from ft_runtime.spare import StackedLayout


def test_published_figures_for_n600_r20_and_r_star() -> None:
    assert 424 <= mu(600, 20) <= 426
    assert sbar_lower(600, 20) == pytest.approx(2.34, abs=0.005)
    assert [r_star(n) for n in (200, 600, 1000)] == [8, 10, 10]
    assert [c(10, k) for k in (0, 1, 5, 6, 9)] == [1, 2, 2, 3, 10]


@pytest.mark.parametrize(("n", "r"), [(600, 8), (200, 9), (1000, 9)])
def test_mu_is_within_two_percent_of_a_monte_carlo_of_the_layout(n: int, r: int) -> None:
    measured, _ = monte_carlo(Spare(StackedLayout.build(n, r)), trials=1500, stacks=False)
    assert measured == pytest.approx(mu(n, r), rel=0.02)


class _ConsecutiveWindow:
    """Type t held by groups t, t−1, …, t−r+1: the literal reading the notes warn about."""

    def __init__(self, n: int, r: int) -> None:
        self.n_groups = n
        self.members = np.arange(n)
        self._holders = (np.arange(n)[:, None] - np.arange(r)) % n

    def masked(self, order: np.ndarray) -> int:
        pos = np.empty(self.n_groups, dtype=np.int64)
        pos[order] = np.arange(len(order))
        return int(pos[self._holders].max(axis=1).min())

    def stacks(self, order: np.ndarray, masked: int) -> np.ndarray:
        return np.ones(masked + 1, dtype=np.int64)


def test_consecutive_offsets_would_miss_the_closed_form() -> None:
    # Why the layout must have distinct differences: a consecutive window masks ~7 % more.
    measured, _ = monte_carlo(_ConsecutiveWindow(600, 8), trials=800, stacks=False)
    assert measured > 1.04 * mu(600, 8)


@pytest.mark.parametrize(("n", "r"), [(200, 9), (600, 8)])
def test_stack_lower_bound_is_within_two_percent_of_the_monte_carlo(n: int, r: int) -> None:
    _, sbar = monte_carlo(Spare(StackedLayout.build(n, r)), trials=40, seed=1)
    assert sbar == pytest.approx(sbar_lower(n, r), rel=0.02)
    assert sbar >= sbar_lower(n, r) - 0.01  # ρ_k ≥ 0: the bound is a lower bound


def test_replication_mu_against_monte_carlo_and_checkpoint_only() -> None:
    measured, stack = monte_carlo(Replication(600, 3), trials=1500)
    assert measured == pytest.approx(mu_replication(600, 3), rel=0.03)
    assert stack == 3.0
    assert monte_carlo(NoRedundancy(10), trials=5) == (0.0, 1.0)


def test_first_order_ttt_of_spare_beats_replication_at_600k_gpus() -> None:
    for n, r in [(200, 9), (600, 8), (1000, 9)]:
        spare = ttt_ratio(n, r, mtbf=5, t_s=1, t_r=60)
        rep = ttt_ratio(n, 3, mtbf=5, t_s=1, t_r=60, replication=True)
        assert 2.0 < spare < rep < 4.5


def test_replica_sets_have_exactly_r_groups_and_leftover_groups_stand_idle() -> None:
    rep = Replication(200, 3)  # 66 sets of 3; groups 198 and 199 hold no replica
    assert len(rep.members) == 198
    sets = [[int(g) for g in rep.members if g % 66 == s] for s in range(66)]
    assert all(len(groups) == 3 for groups in sets)
    # Killing one set wipes out at its third failure, whatever else failed before.
    order = np.array([sets[5][0], sets[7][0], sets[5][1], sets[5][2], sets[7][1]])
    assert rep.masked(order) == 3
    assert rep.masked(order[:3]) == 3  # nothing wiped out yet: all three are masked
    # The Monte-Carlo draws failures among the members only: μ stays the formula's.
    measured, _ = monte_carlo(rep, trials=1500, stacks=False)
    assert measured == pytest.approx(mu_replication(198, 3), rel=0.03)
