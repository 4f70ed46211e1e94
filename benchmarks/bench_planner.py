"""How long one 600k-GPU training run takes to simulate (target: at most 10 s on one core).

Run: ``taskset -c 0 .venv/bin/python benchmarks/bench_planner.py``. It also times ReCtlr
per failure at N = 1000. Besides seconds, each
line gives a ratio against a baseline measured in the same process: a bare SimPy loop
with the same number of step events, so the ratio says how much the failure handling,
Hopcroft–Karp matchings and accounting cost on top of SimPy's own event overhead.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import sys  # noqa: E402
import time  # noqa: E402

import simpy  # noqa: E402

from ft_runtime.planner.config import ClusterConfig, Strategy  # noqa: E402
from ft_runtime.planner.sim import simulate  # noqa: E402

CASES = [
    ("SPARe N=1000 r=9", 1000, Strategy.SPARE, 9),
    ("SPARe N=600 r=8", 600, Strategy.SPARE, 8),
    ("SPARe N=200 r=9", 200, Strategy.SPARE, 9),
    ("Rep N=600 r=3", 600, Strategy.REPLICATION, 3),
]


def _baseline(events: int) -> float:
    env = simpy.Environment()

    def loop() -> simpy.events.ProcessGenerator:
        for _ in range(events):
            yield env.timeout(1.0)

    start = time.perf_counter()
    env.process(loop())
    env.run()
    return time.perf_counter() - start


def _controller(n: int, r: int) -> None:
    """ReCtlr per failure at N groups until the wipe-out (the paper: about 0.1 s)."""
    import numpy as np

    from ft_runtime.spare import ReCtlr, StackedLayout, WipeOutError

    ctl = ReCtlr(StackedLayout.build(n, r))
    times = []
    for g in np.random.default_rng(0).permutation(n):
        start = time.perf_counter()
        try:
            ctl.fail([int(g)])
        except WipeOutError:
            break
        times.append(time.perf_counter() - start)
    base = _baseline(n * r)
    print(
        f"ReCtlr N={n} r={r}: {len(times)} failures, mean {np.mean(times) * 1e3:.1f} ms, "
        f"worst {max(times) * 1e3:.1f} ms  x{np.mean(times) / base:5.1f} of a bare SimPy "
        f"loop of N·r events"
    )


def main() -> int:
    _controller(1000, 9)
    worst = 0.0
    for label, n, strategy, r in CASES:
        cfg = ClusterConfig(gpus=600_000, n_groups=n)
        start = time.perf_counter()
        res = simulate(cfg, strategy, r, seed=0)
        took = time.perf_counter() - start
        base = _baseline(cfg.steps + res.failures)
        worst = max(worst, took)
        print(
            f"{label:18s} {took:6.2f} s  TTT/T0 {res.ttt_ratio:.2f}  failures {res.failures:5d}"
            f"  x{took / base:5.1f} of a bare SimPy loop with as many events"
        )
    print(f"slowest: {worst:.2f} s (target <= 10 s)")
    return 0 if worst <= 10 else 1


if __name__ == "__main__":
    sys.exit(main())
