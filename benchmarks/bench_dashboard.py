"""Cold render time of every dashboard page at 512 ranks, and of the Ranks page at 10k.

Builds two run stores with dashboard.synthetic (512 ranks on 64 hosts for 1000 steps, ten
metrics per rank and step: 5.1 million samples; and 10,000 ranks on 1,250 hosts for 100
steps, four metrics: 4 million samples), then renders each page with Streamlit's AppTest
from a cold cache (st.cache_data cleared, a new AppTest, the page opened directly),
several times, and reports the median. The baseline in the same process is the naive
page: every sample of the run into pandas, as a page that aggregated in pandas would
start.

Run: python benchmarks/bench_dashboard.py [--ranks 512] [--steps 1000] [--big-ranks 10000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import streamlit as st
from streamlit.testing.v1 import AppTest

import dashboard
from dashboard import synthetic
from eagleeye.store import RunReader

APP = str(Path(dashboard.__file__).parent / "streamlit_app.py")
PAGES = ("overview", "ranks", "training", "findings", "actions", "checkpoints", "compare")


def render(run: Path, page: str) -> float:
    """Seconds to render one page of ``run`` from a cold cache."""
    st.cache_data.clear()
    os.environ["EAGLEEYE_DASHBOARD_RUN"] = str(run)
    os.environ["EAGLEEYE_RUNS_DIR"] = str(run.parent)
    started = time.perf_counter()
    at = AppTest.from_file(APP, default_timeout=120)
    at.session_state["live"] = False
    if page != "overview":
        at.switch_page(f"app_pages/{page}.py")
    at.run()
    elapsed = time.perf_counter() - started
    if at.exception:
        raise RuntimeError(f"{page}: {at.exception[0].value}")
    return elapsed


def naive(run: Path) -> float:
    started = time.perf_counter()
    with RunReader(run) as reader:
        reader.samples()
    return time.perf_counter() - started


def measure(run: Path, pages: tuple[str, ...], repeat: int, limit_s: float) -> None:
    baseline = statistics.median(naive(run) for _ in range(repeat))
    print(f"  baseline, every sample into pandas: {baseline:.2f} s")
    for page in pages:
        median = statistics.median(render(run, page) for _ in range(repeat))
        verdict = "ok" if median <= limit_s else f"OVER {limit_s:.0f} s"
        print(
            f"  {page:12s} {median:5.2f} s (cold, median of {repeat}); "
            f"{median / baseline:.2f} × the baseline; {verdict}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=512)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--big-ranks", type=int, default=10_000)
    parser.add_argument("--big-steps", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "runs" / "r512"
        count = synthetic.build(run, args.ranks, args.steps)
        other = Path(tmp) / "runs" / "small"
        synthetic.build(other, 8, args.steps // 10)  # the second run of the comparison
        print(f"{run.name}: {count:,} samples, {args.ranks} ranks, {args.steps} steps")
        measure(run, PAGES, args.repeat, 2.0)
        big = Path(tmp) / "big" / "r10k"
        count = synthetic.build(big, args.big_ranks, args.big_steps, synthetic.SMALL)
        print(f"{big.name}: {count:,} samples, {args.big_ranks} ranks, {args.big_steps} steps")
        measure(big, ("ranks",), args.repeat, 3.0)


if __name__ == "__main__":
    main()
