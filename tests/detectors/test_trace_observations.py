"""Rows each rank stamps with its own clock are still one observation of their step."""

from __future__ import annotations

import numpy as np
import pandas as pd

from detectors.eval.generate import TraceSpec, generate
from detectors.eval.runner import run_trace
from detectors.eval.trace import Trace


def _rows(steps: int = 20, ranks: int = 8, skew: float = 0.15, seed: int = 0) -> pd.DataFrame:
    """Steps of 2 s; each rank stamps its ``step_time`` and ``loss`` rows up to ``skew``
    seconds after the step's end."""
    rng = np.random.default_rng(seed)
    rows = []
    for s in range(steps):
        for r in range(ranks):
            t = 2.0 * s + skew * rng.random()
            base = {"step": s, "job": "j", "replica": 0, "node": f"n{r // 4}", "rank": r}
            rows.append({**base, "time": t, "metric": "loss", "value": 2.0})
            rows.append({**base, "time": t, "metric": "step_time", "value": 2.0})
    return pd.DataFrame(rows)


def test_rows_a_rank_stamps_itself_are_one_observation_of_their_step() -> None:
    rows = _rows()
    trace = Trace.from_long(rows)
    assert trace.steps.tolist() == list(range(20))
    assert trace.present.all()  # every rank's loss and step time in its step's observation
    # stamped with its latest row: the moment the observation is whole
    assert np.allclose(trace.times, rows.groupby("step")["time"].max().to_numpy())


def test_a_step_s_heartbeats_and_far_rows_stay_observations_of_their_own() -> None:
    rows = _rows(steps=10, skew=0.0)
    # a job stuck on step 9: every rank sends its step time again every 0.15 s (within the
    # 0.2 s snap, but each rank's step time would come twice in one observation)
    beats = rows[(rows["step"] == 9) & (rows["metric"] == "step_time")]
    again = [beats.assign(time=beats["time"] + 0.15 * k) for k in range(1, 4)]
    # and step 5's GPUs scraped node by node, 50 ms apart (no completed step): merged, a
    # node of one pipeline stage would be set beside one of another now and then
    gpus = rows[(rows["step"] == 5) & (rows["metric"] == "loss")]
    scrape = gpus.assign(time=gpus["time"] - 1.0 + 0.05 * (gpus["node"] == "n1"))
    scrape = scrape.assign(metric="gpu_temp", value=60.0)
    trace = Trace.from_long(pd.concat([rows, *again, scrape]))
    assert trace.steps.tolist() == [0, 1, 2, 3, 4, 5, 5, 5, 6, 7, 8, 9, 9, 9, 9]
    assert np.diff(trace.times).min() >= 0.05 - 1e-9


def test_detection_does_not_depend_on_each_rank_stamping_its_own_rows() -> None:
    # Before, each rank's rows at its own moment made an observation of one rank: no peer
    # had reported with it, and the slow rank, node and leak went unseen.
    shared = generate(
        TraceSpec(nodes=4, faults=("slow_rank", "slow_node", "memory_leak"), seed=5301)
    )
    rows = shared.to_long()
    skew = np.random.default_rng(1).uniform(0.0, 0.3, len(shared.ranks))
    own = Trace.from_long(rows.assign(time=rows["time"] + skew[rows["rank"].to_numpy()]))
    assert len(own.steps) == len(shared.steps)

    def found(trace: Trace) -> list[tuple[str, str, int]]:
        return sorted(
            (e.finding.kind, str(e.finding.subject), e.finding.step or 0) for e in run_trace(trace)
        )

    expected = found(shared)
    assert {k for k, _, _ in expected} >= {"slow_rank", "slow_node", "memory_leak"}
    assert found(own) == expected
