"""Cost of `eagleeye run --metrics-port`: the exporter's work on a run's telemetry against
the run store's ingestion of the same samples (what every run does), in one process.

A batch is what the hook sends for one step of every rank (13 samples per rank: the step
time, six section times, collective time, loss, grad norm, lr, tokens, a skipped-step flag;
a checkpoint event every tenth step). Both sides take the same batches, timed
alternately; the ratio is the exporter's time over the store's. The ETTR recomputation
(``effective_training`` on every step sample seen, run every 2 s or less often) is timed
apart, at 512 ranks × 1000 steps.

Run from the repository root: ``python benchmarks/bench_exporter.py``.
"""

from __future__ import annotations

import statistics
import tempfile
import time

from collector.types import Sample
from eagleeye.exporter import EagleEyeExporter
from eagleeye.ingest import ingest_samples
from eagleeye.store import RunStore, create_run_dir

SECTIONS = ("data", "forward", "backward", "allreduce", "optimizer", "checkpoint")


def batch(ranks: int, step: int) -> list[Sample]:
    rows = []
    at = 1000.0 + step * 0.1
    for rank in range(ranks):
        labels = {"rank": str(rank), "replica": "0", "node": f"node{rank // 8}", "attempt": "0"}
        values = [("step_time", 0.1 + rank * 1e-5)]
        values += [(f"section.{section}", 0.01) for section in SECTIONS]
        values += [("collective_time", 0.02), ("loss", 2.0), ("grad_norm", 1.0)]
        values += [("lr", 3e-4), ("tokens", 64.0), ("skipped_step", 0.0)]
        rows += [Sample(name, value, at, labels, step=step) for name, value in values]
        if step % 10 == 0:
            rows.append(
                Sample("event.checkpoint", float(step), at, {**labels, "tier": "disk"}, step)
            )
    return rows


def paired(ranks: int, steps: int) -> tuple[float, float]:
    """(store seconds, exporter seconds) per batch, medians over ``steps`` batches."""
    exporter = EagleEyeExporter(run="bench")
    store_times, exporter_times = [], []
    with tempfile.TemporaryDirectory() as tmp:
        store = RunStore(create_run_dir(tmp, "bench"))
        try:
            for step in range(steps):
                rows = batch(ranks, step)
                started = time.perf_counter()
                ingest_samples(store, rows)
                store_times.append(time.perf_counter() - started)
                started = time.perf_counter()
                exporter.observe_samples(rows)
                exporter_times.append(time.perf_counter() - started)
        finally:
            store.close()
    return statistics.median(store_times), statistics.median(exporter_times)


def ettr_seconds(ranks: int, steps: int) -> float:
    exporter = EagleEyeExporter(run="bench", ettr_every_s=float("inf"))
    for step in range(steps):
        exporter.observe_samples(
            Sample("step_time", 0.1, 1000.0 + step * 0.1, {"rank": str(r)}, step=step)
            for r in range(ranks)
        )
    started = time.perf_counter()
    exporter.finish()
    return time.perf_counter() - started


def main() -> None:
    for ranks in (8, 64, 512):
        store_s, exporter_s = paired(ranks, 60 if ranks < 512 else 20)
        per = exporter_s / len(batch(ranks, 1)) * 1e6
        print(
            f"{ranks:4d} ranks: store {store_s * 1e3:7.2f} ms, exporter {exporter_s * 1e3:7.2f} ms"
            f" per step ({per:.1f} µs a sample), ratio {exporter_s / store_s:.2f}"
        )
    print(f"ETTR over 512 ranks × 1000 steps: {ettr_seconds(512, 1000):.2f} s")


if __name__ == "__main__":
    main()
