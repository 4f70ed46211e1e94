"""Checkpoint intervals, availability and ETTR in closed form.

All times share one unit (the caller's); ``delta``/``t_s`` is the checkpoint save time,
``mtbf``/``t_f`` the mean time between failures, ``restart``/``t_r`` the restart time.

>>> round(daly_higher_order(5, 24 * 60), 1), round(daly_higher_order(5, 15), 1)
(116.7, 9.1)
>>> round(ettr_synchronous(18, 10), 3), round(ettr_replica(18, 3, 7, 12), 3)
(0.444, 0.801)
"""

from __future__ import annotations

import math


def _positive(**values: float) -> None:
    for name, v in values.items():
        if not v > 0:
            raise ValueError(f"{name} must be positive, got {v}")


def young(delta: float, mtbf: float) -> float:
    """Young (1974): τ* = √(2δM), the interval that minimises lost time."""
    _positive(delta=delta, mtbf=mtbf)
    return math.sqrt(2 * delta * mtbf)


def daly_first_order(delta: float, mtbf: float) -> float:
    """Daly's first-order interval √(2δM) − δ (the interval excludes the dump itself)."""
    return young(delta, mtbf) - delta


def daly_higher_order(delta: float, mtbf: float) -> float:
    """Daly (2006): √(2δM)·[1 + ⅓(δ/2M)^½ + (1/9)(δ/2M)] − δ for δ < 2M, else M."""
    _positive(delta=delta, mtbf=mtbf)
    if delta >= 2 * mtbf:
        return mtbf
    x = delta / (2 * mtbf)
    return math.sqrt(2 * delta * mtbf) * (1 + math.sqrt(x) / 3 + x / 9) - delta


def daly_wall_time(tau: float, delta: float, mtbf: float, restart: float, solve: float) -> float:
    """Daly's expected wall-clock time M·e^{R/M}·(e^{(τ+δ)/M} − 1)·T_solve/τ."""
    _positive(tau=tau, delta=delta, mtbf=mtbf, solve=solve)
    return mtbf * math.exp(restart / mtbf) * math.expm1((tau + delta) / mtbf) * solve / tau


def saxena_interval(t_s: float, t_f: float, t_r: float) -> float:
    """Saxena et al. (2024) availability optimum T_c* = T_s + √(2(T_f + T_r)T_s + T_s²)."""
    _positive(t_s=t_s, t_f=t_f)
    return t_s + math.sqrt(2 * (t_f + t_r) * t_s + t_s * t_s)


def availability(t_c: float, t_s: float, t_f: float, t_r: float) -> float:
    """A(T_c) = (1 − T_s/T_c)·T_f / (T_f + T_r + T_c/2); its maximiser is ``saxena_interval``.

    Saving costs T_s of every T_c; each failure costs the restart and, on average, half a
    period of lost work.
    """
    _positive(t_c=t_c, t_f=t_f)
    if t_c <= t_s:
        return 0.0
    return (1 - t_s / t_c) * t_f / (t_f + t_r + t_c / 2)


def best_availability(t_s: float, t_f: float, t_r: float) -> float:
    """A* = A(T_c*): the availability at Saxena's optimal period."""
    return availability(saxena_interval(t_s, t_f, t_r), t_s, t_f, t_r)


def ettr_synchronous(mtbf: float, stall: float) -> float:
    """ETTR when every failure stalls the whole job: (MTBF − stall) / MTBF."""
    _positive(mtbf=mtbf)
    return max(0.0, (mtbf - stall) / mtbf)


def ettr_replica(mtbf: float, stall: float, degraded: float, replicas: int) -> float:
    """ETTR with replica-level recovery (FT-HSDP).

    A failure stalls everyone for ``stall``, then its replica is missing for ``degraded``
    while the other R − 1 train: [T_f − stall − degraded + degraded·(R−1)/R] / T_f.
    """
    _positive(mtbf=mtbf, replicas=replicas)
    lost = stall + degraded / replicas
    return max(0.0, (mtbf - lost) / mtbf)
