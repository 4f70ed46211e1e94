"""Scale benchmark: 100k ranks x 16 metrics per step through the streaming detectors.

Measures, in one process on one thread, the median time per step of
  * the peer-outlier detector alone (robust z over every watched feature, persistence,
    localisation),
  * the whole default pipeline (every default detector plus fusion),
  * a pandas-groupby implementation of the same peer comparison (median and MAD per
    metric over the long rows of the step, robust z, threshold): the baseline,
and prints the ratio baseline / peer detector.

Run (alone on the machine, so timings are not shared): .venv/bin/python
benchmarks/bench_detectors.py [--ranks N]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core, before numpy loads its BLAS
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from detectors.config import DetectorsConfig  # noqa: E402
from detectors.eval.generate import TraceSpec, generate  # noqa: E402
from detectors.peer import DEFAULT_FEATURES, PeerOutlier  # noqa: E402
from detectors.stepbatch import StepBatch  # noqa: E402


def pandas_peer(long: pd.DataFrame, z: float = 6.0, min_shift: float = 0.06) -> pd.Series:
    """The baseline: the same robust peer comparison with a pandas groupby per metric."""
    sign = long["metric"].map({k: v.direction for k, v in DEFAULT_FEATURES.items()})
    grouped = long.groupby("metric")["value"]
    med = grouped.transform("median")
    mad = (long["value"] - med).abs().groupby(long["metric"]).transform("median")
    scale = np.maximum(1.4826 * mad, 1e-3 * med.abs() + 1e-12)
    dev = (long["value"] - med) * sign
    return (dev > z * scale) & (dev > min_shift * med.abs())


def _median_ms(fn: Callable[[int], object], steps: int) -> float:
    times = []
    for i in range(steps):
        start = time.perf_counter()
        fn(i)
        times.append((time.perf_counter() - start) * 1000.0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=100_000)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument(
        "--warm", type=int, default=70, help="steps run first: past every warm-up (since_launch)"
    )
    args = parser.parse_args()
    trace = generate(
        TraceSpec(nodes=args.ranks // 8, ranks_per_node=8, faults=(), steps=args.steps, seed=0)
    )
    batches = list(trace.batches())
    watched = [m for m in trace.metrics if m in DEFAULT_FEATURES]
    cols = [trace.metrics.index(m) for m in watched]
    longs = [
        pd.DataFrame(
            {
                "rank": np.tile(trace.ranks, len(cols)),
                "metric": np.repeat(watched, len(trace.ranks)),
                "value": b.values[:, cols].T.ravel(),
            }
        )
        for b in batches
    ]
    peer = PeerOutlier()
    pipeline = DetectorsConfig().build()
    for i in range(args.warm):  # sizes the state arrays, learns offsets, ends the warm-up
        peer.process_step(_step(batches, i))
        pipeline.process_step(_step(batches, i))
    w = args.warm
    ours = _median_ms(lambda i: peer.process_step(_step(batches, w + i)), args.steps)
    whole = _median_ms(lambda i: pipeline.process_step(_step(batches, w + i)), args.steps)
    base = _median_ms(lambda i: pandas_peer(longs[i % len(longs)]), args.steps)
    print(f"ranks={len(trace.ranks)} metrics={len(trace.metrics)} watched={len(watched)}")
    print(f"peer detector       {ours:8.1f} ms/step")
    print(f"whole pipeline      {whole:8.1f} ms/step")
    print(f"pandas groupby peer {base:8.1f} ms/step")
    print(f"speed-up vs pandas  {base / ours:8.1f}x")


def _step(batches: list[StepBatch], i: int) -> StepBatch:
    b = batches[i % len(batches)]
    return StepBatch(
        i + 1, b.time + i, b.ranks, b.nodes, b.replicas, b.features, b.values, b.present
    )


if __name__ == "__main__":
    main()
