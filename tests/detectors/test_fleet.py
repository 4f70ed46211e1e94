"""The second generator: what it simulates is what its labels and its sources say."""

from __future__ import annotations

import numpy as np
import pytest

from detectors.eval.fleet import FLEET_FAULTS, FleetSpec, simulate
from detectors.eval.fleet.emit import Recorder
from detectors.eval.trace import Trace


@pytest.fixture(scope="module")
def trace() -> Trace:
    return simulate(FleetSpec(nodes=4, gpus_per_node=4, seed=11))


def _col(trace: Trace, name: str) -> np.ndarray:
    return trace.values[:, :, trace.metrics.index(name)]


def test_every_class_is_labelled_once_and_the_trace_is_reproducible(trace: Trace) -> None:
    kinds = sorted(w.kind for w in trace.labels)
    assert kinds == sorted([*FLEET_FAULTS, "process_exit"])  # a leak ends in a crash
    again = simulate(FleetSpec(nodes=4, gpus_per_node=4, seed=11))
    assert np.array_equal(trace.values, again.values, equal_nan=True)


def test_sources_speak_their_own_names_and_are_read_in_canonical_ones(tmp_path) -> None:
    rec = Recorder(2)
    rec.add(1.0, 0, "DCGM_FI_DEV_FB_USED", np.array([1024.0, 2048.0]))
    assert set(rec.rows()["metric"]) == {"DCGM_FI_DEV_FB_USED"}
    trace = simulate(FleetSpec(nodes=2, gpus_per_node=4, faults=(), steps=30, seed=1))
    assert {"mem_used", "gpu_temp", "comm_ms", "data_wait_ms", "nic_rx_errors"} <= set(
        trace.metrics
    )


def test_the_hang_freezes_the_whole_job_and_its_culprit_never_waits(trace: Trace) -> None:
    (hang,) = [w for w in trace.labels if w.kind == "hang"]
    culprit = int(hang.subject.split(":")[1])
    stuck = np.flatnonzero(trace.steps == hang.start_step)
    step_times = _col(trace, "step_time")[stuck]
    frozen = stuck[np.isnan(step_times).all(axis=1)]  # observations with no step done
    waits = _col(trace, "in_collective")[frozen]
    assert len(frozen) >= 3  # scrapes and wait reports go on while nothing steps
    assert np.isnan(waits[:, culprit]).all()
    others = np.delete(np.arange(len(trace.ranks)), culprit)
    assert (np.nan_to_num(waits[:, others]) > 0).any(axis=0).all()
    exits = _col(trace, "exit_code")
    assert np.isfinite(exits).any()  # killed, then relaunched from a checkpoint
    assert (np.diff(trace.steps) < 0).any()


def test_a_degraded_nic_shows_in_its_node_s_error_counters_only(trace: Trace) -> None:
    (nic,) = [w for w in trace.labels if w.kind == "nic_degradation"]
    node = nic.subject.split(":")[1]
    errors = _col(trace, "nic_rx_errors")
    during = (trace.steps >= nic.start_step) & (trace.steps <= nic.end_step)
    rows = np.flatnonzero(during & np.isfinite(errors).any(axis=1))
    grown = np.nanmax(errors[rows], axis=0) - np.nanmin(errors[rows], axis=0)
    on_node = trace.nodes == node
    assert grown[on_node].min() > 100 * max(grown[~on_node].max(), 1.0)


def test_healthy_gpus_differ_for_ever_and_steps_have_heavy_tails() -> None:
    trace = simulate(FleetSpec(nodes=4, gpus_per_node=8, faults=(), steps=400, seed=2))
    steps = np.isfinite(_col(trace, "step_time")).all(axis=1)
    compute = 1000 * _col(trace, "step_time")[steps] - _col(trace, "comm_ms")[steps]
    compute = (compute - _col(trace, "data_wait_ms")[steps])[100:]  # past the warm-up
    compute = compute[np.isnan(_col(trace, "section.checkpoint")[steps][100:]).all(axis=1)]
    ratio = compute / np.median(compute, axis=1, keepdims=True)
    assert np.std(np.median(ratio, axis=0)) > 0.015  # a fixed spread of per-GPU speeds
    noise = (ratio / np.median(ratio, axis=0)).ravel() - 1.0
    kurtosis = np.mean(noise**4) / np.mean(noise**2) ** 2
    assert kurtosis > 6.0  # a Gaussian's is 3
    assert np.isfinite(_col(trace, "section.checkpoint")).all(axis=1).any()  # every rank


@pytest.mark.parametrize("seed", [21, 22, 23])
def test_a_ten_percent_slowdown_of_one_rank_is_found_within_twenty_steps(seed: int) -> None:
    from detectors.eval.metrics import score_trace
    from detectors.eval.runner import run_trace

    spec = FleetSpec(
        nodes=4, gpus_per_node=8, faults=("slow_rank",), sizes={"slow_rank": 0.1}, seed=seed
    )
    trace = simulate(spec)
    result = score_trace(trace, run_trace(trace))
    (match,) = result.matches
    assert match.found
    assert match.localised
    assert match.delay_steps <= 20
    assert not result.false_findings
