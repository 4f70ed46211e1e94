"""The issue's targets on generated traces other than the ones the detectors were built on.

Parameters were chosen on seeds 0-9; seeds 3000-3005 first ran in this test and exposed
one fusion fault (a late throughput drop), fixed in the fusion rules, not by tuning to
them. docs/benchmarks.md reports seeds 5000-5019, which nothing was tuned on.
"""

from __future__ import annotations

import numpy as np
import pytest

from collector.types import Subject
from detectors.eval.generate import TraceSpec, generate
from detectors.eval.harness import report
from detectors.eval.metrics import score_trace
from detectors.eval.runner import Emitted, run_trace
from detectors.eval.trace import FaultWindow, Trace
from detectors.types import Finding, Severity


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_targets_on_held_out_seeds() -> None:
    faulty = [generate(TraceSpec(nodes=8, ranks_per_node=8, seed=s)) for s in range(3000, 3006)]
    healthy = [generate(TraceSpec(nodes=32, ranks_per_node=8, faults=(), steps=1500, seed=4000))]
    result = report(
        [score_trace(t, run_trace(t)) for t in faulty],
        [score_trace(t, run_trace(t)) for t in healthy],
    )
    summary = result["summary"]
    assert {k: c["f1"] for k, c in result["classes"].items()} == {
        k: pytest.approx(1.0, abs=0.03) for k in result["classes"]
    }
    assert len(result["classes"]) == 10
    assert summary["localisation"] >= 0.97
    assert summary["median_delay_hard_steps"] <= 2.0
    assert summary["median_delay_failslow_steps"] <= 10.0
    assert summary["healthy_node_days"] > 1.0
    assert summary["false_alarms_per_node_day"] <= 1.0


def test_a_missed_fault_and_a_false_alarm_are_counted() -> None:
    trace = generate(TraceSpec(nodes=2, ranks_per_node=4, faults=("xid",), seed=1))
    emitted = run_trace(trace)
    assert [m.found for m in score_trace(trace, emitted).matches] == [True]
    missed = score_trace(trace, [])
    assert [m.found for m in missed.matches] == [False]
    shifted = [type(e)(e.finding, e.step + 500, e.time) for e in emitted]
    assert len(score_trace(trace, shifted).false_findings) == len(emitted)


def _one_rank(steps: np.ndarray, metric: str, window: FaultWindow) -> Trace:
    """A trace of one rank, one observation a second, with one fault window."""
    values = np.ones((len(steps), 1, 1))
    return Trace(
        "job",
        np.array([0]),
        np.array(["n0"], dtype=object),
        np.array([0]),
        (metric,),
        steps,
        np.arange(len(steps), dtype=float),
        values,
        np.ones(values.shape, dtype=bool),
        (window,),
    )


def test_delay_counts_from_the_first_time_a_restarted_run_reached_the_step() -> None:
    steps = np.array([0, 1, 2, 3, 1, 2, 3, 4])  # a restart after step 3 went back to 1
    trace = _one_rank(steps, "step_time", FaultWindow("process_exit", "rank:0", 3, 3))
    finding = Finding("process_exit", Subject(rank=0), 1.0, Severity.CRITICAL, 3.5, 3)
    match = score_trace(trace, [Emitted(finding, 3, 3.5)]).matches[0]
    assert match.found
    assert match.delay_s == 1.5


def test_delay_in_steps_is_in_steps_however_many_scrapes_fall_in_each() -> None:
    """Three GPU scrapes between step completions 4 s apart: a delay of 8 s is 2 steps
    (it was counted in the median gap between observations: 8 steps)."""
    steps = np.repeat(np.arange(10), 4)  # each step: its completion, then three scrapes
    trace = _one_rank(steps, "gpu_temp", FaultWindow("thermal", "rank:0", 5, 9))
    finding = Finding("thermal", Subject(rank=0), 1.0, Severity.WARN, 27.0, 6)
    result = score_trace(trace, [Emitted(finding, 6, 27.0)])
    assert result.step_seconds == 4.0
    assert result.matches[0].delay_s == 8.0
    assert result.matches[0].delay_steps == 2.0


def test_the_cross_protocol_refuses_an_unknown_generator_before_any_work() -> None:
    from detectors.eval.protocol import cross

    with pytest.raises(ValueError, match="no generator 'nope'"):
        cross(tuned_on=("nope",))


def test_the_cross_command_takes_fresh_report_seeds() -> None:
    import argparse

    from eagleeye.commands import eval as eval_command

    parser = argparse.ArgumentParser()
    eval_command.add_parser(parser.add_subparsers())
    args = parser.parse_args(
        ["eval", "cross", "--tuned-on", "default", "--fleet-seeds", "9100-9119"]
    )
    assert (args.tuned_on, args.fleet_seeds, args.fleet_healthy_seeds) == (
        "default",
        range(9100, 9120),
        None,
    )
