"""The live detector set on synthetic frames: feature derivation, fusion, lifecycle."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from collector.nccl import read_flight_record
from collector.nccl_hang import flight_record_events
from collector.types import JOB, Frame, Subject
from detectors.hang import CollectiveHang
from detectors.types import Severity
from eagleeye.cli import main
from eagleeye.detection import (
    FusedDetectors,
    flight_record_frames,
    host_detectors,
    host_tier_config,
    live_config,
    live_detectors,
    peer_features,
    replay_config,
)
from eagleeye.errors import EagleEyeError
from eagleeye.recorded import recorded_trace
from eagleeye.store import RunStore
from tests.detectors._batches import wandering_memory


def test_peer_features_leave_collectives_data_and_checkpoints_out_of_compute() -> None:
    values = {
        "step_time": 1.0,
        "collective_time": 0.2,
        "section.data": 0.1,
        "section.checkpoint": 0.3,
    }
    out = peer_features(values)
    assert out["compute_ms"] == pytest.approx(400.0)
    assert (out["comm_ms"], out["data_wait_ms"]) == pytest.approx((200.0, 100.0))
    assert peer_features({"loss": 2.0}) == {"loss": 2.0}  # no step report, nothing derived


def _step_frames(step: int, rng: np.random.Generator, slow: float = 0.0) -> list[Frame]:
    frames = []
    for rank in range(4):
        compute = 0.05 * (1 + 0.3 * rng.random()) + (slow if rank == 2 else 0.0)
        wait = 0.02 * rng.random()
        values = {
            "step_time": compute + wait,
            "collective_time": wait,
            "section.data": 0.001,
            "loss": 3.0 - 0.01 * step + 0.05 * rng.random(),
            "grad_norm": 1.0 + 0.2 * rng.random(),
        }
        frames.append(Frame(Subject(0, rank, f"node{rank // 2}"), step, 100.0 + step, values))
    return frames


def _run(slow_from: int | None, steps: int = 40) -> list:
    rng = np.random.default_rng(7)
    fused = FusedDetectors(live_config().build())
    found = []
    for step in range(steps):
        slow = 0.3 if slow_from is not None and step >= slow_from else 0.0
        for frame in _step_frames(step, rng, slow):
            found += fused.process(frame)
        found += fused.poll(100.0 + step)
    return found + fused.flush()


def test_a_replay_of_a_recorded_trace_has_the_hosts_gpu_rules() -> None:
    # `eagleeye eval trace --live` and `detect --live`: an XID in a recorded trace is found
    # as a live run's host finds it, as are the other rules the hosts' GPU sources feed.
    names = {spec.name for spec in replay_config().specs}
    assert {"xid", "memory_fatal", "thermal_throttle"} <= names
    assert {d.name for d in host_detectors()} - {"nccl_flight_record"} <= names
    detectors = replay_config().build()
    frames = [Frame(Subject(0, r, "n0"), 5, 1.0, {"step_time": 0.5}) for r in range(4)]
    frames[2] = Frame(Subject(0, 2, "n0"), 5, 1.0, {"step_time": 0.5, "xid": 79.0})
    found = [f for frame in frames for f in detectors.process(frame)]
    assert [(f.kind, f.subject.rank) for f in found] == [("xid", 2)]


def test_jitter_of_a_loaded_host_gives_no_finding() -> None:
    assert _run(slow_from=None) == []


def test_a_straggler_is_one_slow_rank_finding_with_its_evidence() -> None:
    found = _run(slow_from=12)
    assert [(f.kind, f.subject.rank, f.severity) for f in found] == [
        ("slow_rank", 2, Severity.WARN)
    ]
    assert 12 <= (found[0].step or 0) <= 16
    assert found[0].evidence["compute_ms"] > 5 * found[0].evidence["compute_ms_peer_median"]


def _synchronous_job(jitter: float, slow_from: int, steps: int = 120, slower: float = 1.1) -> list:
    """16 ranks on 2 nodes in lockstep: each rank computes (its GPU's fixed speed, noise
    of ``jitter``), then waits in the all-reduce for the slowest; rank 11 computes
    ``slower`` times longer from ``slow_from``. Fed to the live fused tier as the hook
    reports it."""
    rng = np.random.default_rng(3)
    speed = 1.0 + 0.015 * rng.standard_normal(16)
    fused = FusedDetectors(live_config().build())
    found = []
    for step in range(steps):
        compute = 0.2 * speed * np.exp(jitter * rng.standard_normal(16))
        if step >= slow_from:
            compute[11] *= slower
        step_time = compute.max() + 0.02
        for rank in range(16):
            values = {
                "step_time": step_time,
                "collective_time": step_time - compute[rank] - 0.001,
                "section.data": 0.001,
            }
            subject = Subject(0, rank, f"node{rank // 8}")
            found += fused.process(Frame(subject, step, 100.0 + step * step_time, values))
    return found + fused.flush()


@pytest.mark.parametrize("slower", [1.1, 1.5])
def test_a_slow_rank_of_a_quiet_job_is_found_live_once(slower: float) -> None:
    # 50 % is the coarse bar: crossed now and then, 30 steps after the precise one fired.
    found = _synchronous_job(jitter=0.01, slow_from=60, slower=slower)
    assert [(f.kind, f.subject.rank) for f in found] == [("slow_rank", 11)]
    assert 60 < (found[0].step or 0) <= 80  # within 20 steps


def test_a_noisy_host_keeps_the_coarse_bar() -> None:
    # Compute times that stray by a third from step to step (a shared CPU host): a 10 %
    # slowdown is not told from the noise, and nothing is claimed.
    assert _synchronous_job(jitter=0.3, slow_from=60) == []


def _loss_job(spread: float, spike: float) -> list:
    """8 ranks reporting a loss that falls from 6 to 3 with lognormal noise of ``spread``,
    every rank's ``spike`` times higher at step 150, fed to the live fused tier."""
    rng = np.random.default_rng(5)
    fused = FusedDetectors(live_config().build())
    found = []
    for step in range(200):
        loss = (3.0 + 3.0 * np.exp(-step / 40)) * rng.lognormal(0.0, spread, 8)
        if step == 150:
            loss *= spike
        for rank in range(8):
            values = {"step_time": 0.2, "loss": float(loss[rank])}
            found += fused.process(Frame(Subject(0, rank, "node0"), step, 100.0 + step, values))
    return found + fused.flush()


def test_a_loss_spike_of_forty_per_cent_is_found_live_where_the_loss_is_quiet() -> None:
    # a large batch's loss (1 % of noise) rising by 40 % is a spike; a few dozen tokens'
    # (20 % of noise) doubling is not, nor is a 40 % rise among it
    assert _loss_job(0.01, 1.0) == []
    found = _loss_job(0.01, 1.4)
    assert [(f.kind, f.subject, f.step) for f in found] == [("loss_spike", JOB, 150)]
    assert _loss_job(0.2, 2.0) == []


def test_hard_rules_and_progress_stall_stay_outside_fusion() -> None:
    names = [d.name for d in live_detectors()]
    assert names == ["process_exit", "non_finite_loss", "progress_stall", "fused"]


def test_export_of_a_run_without_steps_is_a_clear_error(tmp_path) -> None:
    store = RunStore(tmp_path)
    store.set_meta("run_id", "empty")
    store.close()
    with pytest.raises(EagleEyeError, match="recorded no completed step"):
        recorded_trace(tmp_path)


def test_export_wants_a_trace_file_name(tmp_path, capsys) -> None:
    assert main(["eval", "export", str(tmp_path), str(tmp_path / "out.txt")]) == 2
    assert "OUT must end in .csv or .parquet" in capsys.readouterr().err


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nccl"


def _hung_job(dumps: bool) -> list:
    """Three ranks step, then hang; none of them reports its collective waits."""
    det = CollectiveHang(k=2.0)
    for step in range(5):
        for rank in range(3):
            det.process(Frame(Subject(0, rank, "n0"), step, float(step), {"step_time": 1.0}))
    if dumps:
        records = [read_flight_record(FIXTURES / f"nccl_trace_rank_{r}.json") for r in range(3)]
        events = flight_record_events(records, time=5.0).events
        for frame in flight_record_frames(e.to_sample() for e in events):
            det.process(frame)
    return list(det.poll(10.0))


def test_flight_recorder_dumps_name_the_rank_that_never_joined() -> None:
    (blind,) = _hung_job(dumps=False)
    assert str(blind.subject) == "job"  # nobody said who waits: the whole job
    (found,) = _hung_job(dumps=True)
    assert (found.kind, found.subject.rank) == ("hang", 1)
    assert found.evidence["flight_recorder"] == 1.0
    assert found.evidence["never_entered_seq"] == 5.0
    assert found.evidence["ranks_joined"] == 2.0


def test_ranks_that_closed_their_sessions_are_not_hung_while_they_shut_down() -> None:
    detectors = live_detectors()
    rng = np.random.default_rng(3)
    for step in range(20):
        for frame in _step_frames(step, rng):
            for detector in detectors:
                detector.process(frame)
    for rank in range(4):  # training over: a last checkpoint, results, then the exit
        closing = Frame(Subject(0, rank, f"node{rank // 2}"), 19, 120.0, {"closing": 1.0})
        for detector in detectors:
            detector.process(closing)
    assert [f for detector in detectors for f in detector.poll(150.0)] == []
    assert [f for detector in detectors for f in detector.poll(120.0 + 3600.0)] == []


def _restarted_run(fused: FusedDetectors) -> list:
    """40 steps whose loss falls to 1.0, a restart of the whole job, and the new attempt
    starting over from its initial loss (no checkpoint was loaded)."""
    rng = np.random.default_rng(5)
    found = []
    for step in range(40):
        for frame in _step_frames(step, rng):
            values = {**frame.values, "loss": 1.0 + 3.0 * np.exp(-step / 4)}
            found += fused.process(Frame(frame.subject, step, frame.time, values))
    found += fused.process(Frame(JOB, None, 150.0, {"job_restart": 1.0}))
    for step in range(10):
        for frame in _step_frames(step, rng):
            values = {**frame.values, "loss": 4.0 + 0.05 * rng.random()}
            found += fused.process(Frame(frame.subject, step, 200.0 + step, values))
    return found + fused.flush()


def test_each_attempt_of_the_job_is_a_new_baseline() -> None:
    config = live_config()
    assert _restarted_run(FusedDetectors(config.build(), config=config)) == []
    # Without the new baseline, the new attempt's first loss is a spike against the old.
    kept = _restarted_run(FusedDetectors(config.build()))
    assert "loss_spike" in {f.kind for f in kept}


@pytest.mark.parametrize("seed", range(3))
def test_a_hosts_judge_finds_a_slow_leak_in_wandering_memory_and_nothing_without(
    seed: int,
) -> None:
    """The host tier as an agent runs it over its 8 ranks (``host_tier_config``)."""
    healthy, leaking = host_tier_config().build(), host_tier_config().build()
    quiet = [f for b in wandering_memory(seed) for f in healthy.process_step(b)]
    assert quiet + healthy.flush() == []
    found = [f for b in wandering_memory(seed, leak=0.0077) for f in leaking.process_step(b)]
    leaks = [f for f in found + leaking.flush() if f.kind == "memory_leak"]
    assert leaks, "a leak of 0.0077 GB/s went unfound"
    assert {f.subject.rank for f in leaks} == {3}
