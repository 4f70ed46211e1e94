"""The simulator against SPARe's main table (600k GPUs, m = 5 min Weibull k = 0.78)."""

from __future__ import annotations

import statistics

import pytest

from ft_runtime.planner.config import ClusterConfig, Strategy
from ft_runtime.planner.sim import default_checkpoint, simulate
from ft_runtime.planner.spare_math import ttt_ratio

# N: (paper TTT/T0, r used by the paper)
SPARE_TABLE = {200: (2.92, 9), 600: (2.49, 8), 1000: (2.34, 9)}
REP_TABLE = {200: (6.07, 3), 600: (4.27, 3), 1000: (3.88, 3)}


def _ttt(n: int, strategy: Strategy, r: int, seeds: int = 2, **kw: object) -> float:
    cfg = ClusterConfig(n_groups=n, **kw)  # type: ignore[arg-type]
    return statistics.mean(simulate(cfg, strategy, r, seed=s).ttt_ratio for s in range(seeds))


@pytest.mark.parametrize("n", sorted(SPARE_TABLE))
def test_spare_time_to_train_is_within_ten_percent_of_the_paper(n: int) -> None:
    paper, r = SPARE_TABLE[n]
    assert _ttt(n, Strategy.SPARE, r) == pytest.approx(paper, rel=0.10)


# Seeds per replication entry. At N = 200 one run's TTT/T0 spreads 2.3 % (sd over 30
# seeds; 1.3-1.6 % at N = 600/1000) around a mean 8.3 % below the paper, so two seeds could
# land on either side of the 10 % line (seeds 0-3 average -10.3 %); sixteen bring the
# mean's error down to 0.6 %.
REP_SEEDS = {200: 16, 600: 2, 1000: 2}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("n", sorted(REP_TABLE))
def test_replication_time_to_train_is_within_ten_percent_of_the_paper(n: int) -> None:
    paper, r = REP_TABLE[n]
    ttt = _ttt(n, Strategy.REPLICATION, r, seeds=REP_SEEDS[n])
    assert ttt == pytest.approx(paper, rel=0.10)


def test_three_way_replication_is_the_best_degree() -> None:
    # The paper (and Ferreira et al. 2011): r = 3; r = 2 suffers from bursty failures.
    ttt = {r: _ttt(600, Strategy.REPLICATION, r, seeds=1) for r in (2, 3, 4)}
    assert ttt[3] < ttt[4] < ttt[2]


def test_spare_beats_replication_and_the_first_order_bound_holds() -> None:
    for n in (200, 1000):
        spare = _ttt(n, Strategy.SPARE, SPARE_TABLE[n][1], seeds=1)
        rep = _ttt(n, Strategy.REPLICATION, 3, seeds=1)
        assert spare < 0.8 * rep  # the paper: 40-52 % lower
        # The paper notes (§1.6): analytic J (exponential, S̄ = bound) is below the simulation.
        assert ttt_ratio(n, SPARE_TABLE[n][1], 300, 60, 3600) <= spare


def test_checkpoint_only_makes_no_progress_in_the_restart_dominant_regime() -> None:
    res = simulate(ClusterConfig(n_groups=600), Strategy.CKPT)
    assert not res.completed
    assert res.ttt_ratio == float("inf")
    assert res.masked_per_wipe == 0
    assert res.wipe_outs >= ClusterConfig().max_restart_attempts
    # Even with exponential failures and restarts that replace failed hardware for free,
    # it rarely survives to its next save (e^-2.5): less than 2 % productive over 30 T0.
    kind = ClusterConfig(
        n_groups=600,
        weibull_shape=1.0,
        failure_model="system",
        carry_restart_failures=False,
        steps=300,
    )
    slow = simulate(kind, Strategy.CKPT)
    assert not slow.completed
    assert slow.availability < 0.02


def test_without_failures_the_run_takes_exactly_t0_plus_saves() -> None:
    cfg = ClusterConfig(n_groups=100, mtbf_s=1e15, jitter=0, steps=500)
    res = simulate(cfg, Strategy.SPARE, 4, checkpoint_s=1e9)
    assert res.ttt_ratio == pytest.approx(1.0)
    assert res.failures == 0
    assert res.mean_stack == 1.0
    saving = simulate(cfg, Strategy.REPLICATION, 3, checkpoint_s=(3 * 64 + 1) * 100 - 1)
    # Replication computes r layers per step; a save after every 100 steps adds 60 s each.
    assert saving.ttt_s == pytest.approx(500 * (3 * 64 + 1) + 4 * 60)


def test_same_seed_same_run_and_progress_is_reported() -> None:
    cfg = ClusterConfig(n_groups=200, steps=2000)
    seen: list[float] = []
    a = simulate(cfg, Strategy.SPARE, 9, seed=3, progress=seen.append)
    b = simulate(cfg, Strategy.SPARE, 9, seed=3)
    assert a == b
    assert seen[-1] == 1.0
    assert len(seen) >= 50


@pytest.mark.parametrize("model", ["system", "group"])
def test_other_failure_models_also_reproduce_spare(model: str) -> None:
    ttt = _ttt(600, Strategy.SPARE, 8, seeds=1, failure_model=model)
    assert ttt == pytest.approx(2.49, rel=0.10)


def test_default_checkpoint_follows_saxena_with_mu_times_m() -> None:
    cfg = ClusterConfig(n_groups=600)
    assert (
        default_checkpoint(cfg, Strategy.CKPT, 1)
        < default_checkpoint(cfg, Strategy.REPLICATION, 3)
        < default_checkpoint(cfg, Strategy.SPARE, 8)
    )


def test_bad_config_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="must be positive: mtbf_s=0"):
        ClusterConfig(mtbf_s=0)
    with pytest.raises(ValueError, match="failure_model must be"):
        ClusterConfig(failure_model="poisson")
    with pytest.raises(ValueError, match="needs carry_restart_failures"):
        ClusterConfig(carry_restart_failures=False)
    with pytest.raises(ValueError, match="checkpoint_s must be positive"):
        simulate(ClusterConfig(n_groups=10, steps=10), Strategy.SPARE, 2, checkpoint_s=-1)
