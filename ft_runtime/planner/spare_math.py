"""SPARe's closed forms: endurable failures, stack overhead, normalised time-to-train.

>>> round(mu(600, 20)), round(sbar_lower(600, 20), 2), [r_star(n) for n in (200, 600, 1000)]
(424, 2.34, [8, 10, 10])
"""

from __future__ import annotations

import math

from ft_runtime.planner.intervals import best_availability


def _check(n: int, r: int) -> None:
    if n < 2 or not 1 <= r <= n:
        raise ValueError(f"need N >= 2 and 1 <= r <= N, got N={n}, r={r}")


def c(n: int, k: int) -> int:
    """c(k) = ⌈N/(N−k)⌉: the least stack number after k of N groups failed."""
    if not 0 <= k < n:
        raise ValueError(f"k must be in [0, N), got k={k}, N={n}")
    return -(-n // (n - k))


def mu(n: int, r: int) -> float:
    """μ(N, r) ≈ Γ(1+1/r)·N^{1−1/r}: mean group failures SPARe masks before a wipe-out."""
    _check(n, r)
    return math.gamma(1 + 1 / r) * math.pow(n, 1 - 1 / r)


def mu_replication(n: int, r: int) -> float:
    """Traditional replication in N/r disjoint sets of r: Γ(1+1/r)·N·(N/r)^{−1/r}."""
    _check(n, r)
    return math.gamma(1 + 1 / r) * n * math.pow(n / r, -1 / r)


def sbar_lower(n: int, r: int) -> float:
    """S̄ lower bound: the mean of c(k) over k = 0 … ⌊μ⌋−1 (no patch-compute correction)."""
    m = max(1, math.floor(mu(n, r)))
    return sum(c(n, k) for k in range(min(m, n - 1))) / min(m, n - 1)


def ttt_ratio(
    n: int, r: int, mtbf: float, t_s: float, t_r: float, *, replication: bool = False
) -> float:
    """J(r) = S̄ / A*(μ·m): first-order TTT/T₀ of SPARe (or of replication, overhead r).

    Args:
        n, r: groups and redundancy.
        mtbf: system MTBF m (one failure per m); μ·m is the mean time to a wipe-out.
        t_s, t_r: checkpoint save and restart time, in the unit of ``mtbf``.
        replication: evaluate traditional replication (overhead exactly r) instead.
    """
    if replication:
        return r / best_availability(t_s, mu_replication(n, r) * mtbf, t_r)
    return sbar_lower(n, r) / best_availability(t_s, mu(n, r) * mtbf, t_r)


def r_star(n: int) -> int:
    """r* ≈ ⌊log₂N + 0.833⌋, from μ(N, r*) ≈ N/2 (where S̄ stays near 2)."""
    if n < 2:
        raise ValueError(f"need N >= 2, got {n}")
    return math.floor(math.log2(n) + 0.833)
