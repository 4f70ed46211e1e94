"""Render time of every dashboard page on a run with over a million samples.

Builds a run store (64 ranks on 16 nodes, 1,310 steps, 12 metrics per rank and step, a
collective per rank and step, findings and actions), then renders each page with
Streamlit's AppTest from a cold cache, several times, and reports the median. The
baseline in the same process is the naive page: reading every sample into pandas.

Run: python benchmarks/bench_dashboard.py [--ranks 64] [--steps 1310]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import streamlit as st
from streamlit.testing.v1 import AppTest

import dashboard
from collector.types import Sample, Subject
from detectors.types import Finding, Severity
from eagleeye.store import RunReader, RunStore
from ft_runtime.types import Action, ActionKind, LifecycleEvent, Outcome, OutcomeStatus, Phase

METRICS = (
    "step_time",
    "loss",
    "grad_norm",
    "lr",
    "tokens",
    "skipped_step",
    "section.data",
    "section.forward",
    "section.backward",
    "section.allreduce",
    "section.optimizer",
    "section.checkpoint",
)
APP = str(Path(dashboard.__file__).parent / "streamlit_app.py")
PAGES = ("overview", "ranks", "training", "findings", "actions", "checkpoints")


def build(run: Path, ranks: int, steps: int) -> int:
    store = RunStore(run, flush_interval_s=1.0, max_batch=200_000)
    rng = np.random.default_rng(0)
    store.add_event(LifecycleEvent("job", Phase.LAUNCH, 0.0, 0, {}))
    for rank in range(ranks):
        store.add_event(
            LifecycleEvent(
                f"rank:{rank}",
                Phase.LAUNCH,
                0.0,
                0,
                {"replica": rank // 8, "node": f"node{rank // 4}"},
            )
        )
    count = 0
    for step in range(steps):
        t = 1.0 + step * 0.5
        for rank in range(ranks):
            labels = {
                "rank": str(rank),
                "replica": str(rank // 8),
                "node": f"node{rank // 4}",
                "attempt": "0",
            }
            values = rng.random(len(METRICS))
            store.add_samples(
                Sample(m, float(v), t, labels, step) for m, v in zip(METRICS, values, strict=True)
            )
            store.add_collective(
                Sample(
                    "collective", 0.01, t, {**labels, "op": "all_reduce", "seq": str(step)}, step
                )
            )
            count += len(METRICS)
        if step % 100 == 50:
            fid = store.add_finding(
                Finding(
                    "slow_rank",
                    Subject(rank=step % ranks),
                    3.0,
                    Severity.WARN,
                    t,
                    step,
                    {"step_time": 2.0},
                    "peer",
                )
            )
            store.add_outcome(
                Outcome(
                    Action(ActionKind.NOTIFY, "job", "slow", f"k{step}"), OutcomeStatus.DONE, "", t
                ),
                fid,
                False,
                t,
            )
            store.add_checkpoint(t, step, "PERSISTENT", "disk", rank=0, nbytes=1 << 20)
    store.close()
    return count


def render(run: Path, page: str) -> float:
    st.cache_data.clear()
    os.environ["EAGLEEYE_DASHBOARD_RUN"] = str(run)
    started = time.perf_counter()
    at = AppTest.from_file(APP, default_timeout=120)
    at.session_state["live"] = False
    at.run()
    if page != "overview":
        at.switch_page(f"app_pages/{page}.py")
        at.run()
    elapsed = time.perf_counter() - started
    if at.exception:
        raise RuntimeError(f"{page}: {at.exception[0].value}")
    return elapsed


def naive(run: Path) -> float:
    started = time.perf_counter()
    reader = RunReader(run)
    reader.samples()
    reader.close()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--steps", type=int, default=1310)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp)
        count = build(run, args.ranks, args.steps)
        print(f"run store: {count:,} samples, {args.ranks} ranks, {args.steps} steps")
        baseline = statistics.median(naive(run) for _ in range(args.repeat))
        print(f"baseline, every sample into pandas: {baseline:.2f} s")
        for page in PAGES:
            times = [render(run, page) for _ in range(args.repeat)]
            median = statistics.median(times)
            print(
                f"{page:12s} {median:5.2f} s (cold cache, median of {args.repeat}); "
                f"{median / baseline:.2f} × the baseline"
            )


if __name__ == "__main__":
    main()
