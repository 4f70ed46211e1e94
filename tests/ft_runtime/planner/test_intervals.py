from __future__ import annotations

import pytest
from scipy.optimize import minimize_scalar

from ft_runtime.planner.intervals import (
    availability,
    best_availability,
    daly_first_order,
    daly_higher_order,
    daly_wall_time,
    ettr_replica,
    ettr_synchronous,
    saxena_interval,
    young,
)

DALY = [(24 * 60, 117.0, 116.7), (6 * 60, 57.0, 56.7), (15, 9.1, 9.2)]  # M, paper, argmin T_w


@pytest.mark.parametrize(("mtbf", "published", "_argmin"), DALY)
def test_daly_higher_order_reproduces_the_papers_test_vectors(
    mtbf: float, published: float, _argmin: float
) -> None:
    assert round(daly_higher_order(5, mtbf), 1 if published < 10 else 0) == published


@pytest.mark.parametrize(("mtbf", "_published", "argmin"), DALY)
def test_daly_interval_is_near_the_argmin_of_his_wall_time_model(
    mtbf: float, _published: float, argmin: float
) -> None:
    res = minimize_scalar(
        lambda tau: daly_wall_time(tau, 5, mtbf, 10, 500 * 60), bounds=(1, 600), method="bounded"
    )
    assert res.x == pytest.approx(argmin, abs=0.1)
    assert daly_higher_order(5, mtbf) == pytest.approx(res.x, rel=0.02)


def test_young_and_daly_first_order() -> None:
    assert young(5, 1440) == pytest.approx(120.0)
    assert daly_first_order(5, 1440) == pytest.approx(115.0)
    assert daly_higher_order(100, 40) == 40  # δ ≥ 2M: the interval is M


@pytest.mark.parametrize(("t_s", "t_f", "t_r"), [(1, 220, 60), (1, 5, 60), (0.5, 2000, 10)])
def test_saxena_interval_maximises_the_availability(t_s: float, t_f: float, t_r: float) -> None:
    res = minimize_scalar(
        lambda tc: -availability(tc, t_s, t_f, t_r), bounds=(t_s * 1.01, 1e4), method="bounded"
    )
    assert saxena_interval(t_s, t_f, t_r) == pytest.approx(res.x, rel=1e-3)
    assert best_availability(t_s, t_f, t_r) == pytest.approx(-res.fun, rel=1e-6)


def test_saxena_tends_to_young_when_saves_are_cheap() -> None:
    assert saxena_interval(0.01, 1e6, 10) == pytest.approx(young(0.01, 1e6), rel=1e-3)


def test_availability_of_a_period_shorter_than_the_save_is_zero() -> None:
    assert availability(1, 2, 100, 10) == 0.0


def test_ettr_of_synchronous_and_replica_recovery_match_ft_hsdp() -> None:
    assert ettr_synchronous(18, 10) == pytest.approx(0.444, abs=1e-3)
    assert ettr_replica(18, 3, 7, 12) == pytest.approx(0.801, abs=1e-3)


def test_bad_inputs_name_the_argument() -> None:
    with pytest.raises(ValueError, match="mtbf must be positive"):
        young(1, 0)
    with pytest.raises(ValueError, match="t_s must be positive"):
        saxena_interval(0, 1, 1)
