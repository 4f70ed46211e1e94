from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pytest

from collector.types import JOB, Frame, Subject
from detectors.fusion import FusionPolicy
from detectors.peer import PeerOutlier
from detectors.pipeline import DetectorPipeline, Fuser
from detectors.types import Finding, Severity
from tests.detectors._batches import batch, noisy


def _f(
    kind: str, subject: Subject, step: int, severity: Severity = Severity.WARN, **evidence: float
) -> Finding:
    return Finding(kind, subject, 1.0, severity, float(step), step, evidence, "test")


R3 = Subject(0, 3, "n0")


def test_findings_on_one_subject_merge_into_the_root_cause() -> None:
    fuser = Fuser(FusionPolicy(hold_steps=2))
    assert fuser.add(_f("slow_rank", R3, 10, compute_ms=4000.0)) == []
    assert fuser.add(_f("thermal", R3, 11, gpu_temp=90.0)) == []
    out = fuser.tick(12.0)
    assert [(f.kind, f.step) for f in out] == [("thermal", 10)]
    assert out[0].evidence["compute_ms"] == 4000
    assert out[0].evidence["gpu_temp"] == 90
    assert fuser.add(_f("slow_rank", R3, 13)) == []  # deduplicated while the incident is open


def test_critical_findings_are_released_at_once_and_escalate_a_warning() -> None:
    fuser = Fuser()
    fuser.add(_f("slow_rank", R3, 10))
    fuser.tick(12.0)
    out = fuser.add(_f("hang", R3, 14, Severity.CRITICAL))
    assert [f.kind for f in out] == ["hang"]


def test_a_cause_found_after_its_effect_was_released_is_released_too() -> None:
    # A GPU polled every few steps shows its heat after its slower steps were reported:
    # the thermal finding names the fault's cause and goes out; later effects are absorbed.
    fuser = Fuser(FusionPolicy(hold_steps=2))
    fuser.add(_f("slow_rank", R3, 10))
    assert [f.kind for f in fuser.tick(12.0)] == ["slow_rank"]
    fuser.add(_f("thermal", R3, 13, gpu_temp=81.0))
    out = fuser.tick(15.0)
    assert [(f.kind, f.step) for f in out] == [("thermal", 13)]
    assert fuser.add(_f("slow_rank", R3, 16)) == []
    assert fuser.add(_f("thermal", R3, 17)) == []
    assert fuser.tick(30.0) == []
    # a kind that does not explain the released one is absorbed by it, as before
    fuser.add(_f("nic_degradation", Subject(0, 5, "n1"), 40))
    fuser.tick(42.0)
    fuser.add(_f("thermal", Subject(0, 5, "n1"), 43))
    assert fuser.tick(46.0) == []


def test_throughput_drop_near_a_specific_fault_is_absorbed() -> None:
    fuser = Fuser()
    fuser.add(_f("throughput_drop", JOB, 10))
    fuser.add(_f("slow_rank", R3, 11))
    out = fuser.tick(14.0)
    assert [f.kind for f in out] == ["slow_rank"]
    assert fuser.add(_f("throughput_drop", JOB, 15)) == []
    assert fuser.tick(30.0) == []


def test_a_symptom_taken_in_by_a_later_fault_does_not_date_it() -> None:
    # A job slowed by congestion from step 10, held for its cause; a rank slow from step 25
    # takes it in. The fault is the rank's, from step 25, not from the congestion's step.
    fuser = Fuser(FusionPolicy(hold_steps=2))
    fuser.add(_f("throughput_drop", JOB, 10, steps_shifted=4.0))
    fuser.add(_f("metric_outlier", R3, 12))
    fuser.add(_f("slow_rank", R3, 25, compute_ms=4000.0))
    out = fuser.tick(28.0)
    assert [(f.kind, f.subject, f.step, f.time) for f in out] == [("slow_rank", R3, 25, 25.0)]
    assert out[0].evidence["merged_findings"] == 3
    # parts of one fault still date it from the first: the clock before the temperature
    fuser.add(_f("thermal", Subject(0, 5, "n1"), 40, sm_clock=900.0))
    fuser.add(_f("thermal", Subject(0, 5, "n1"), 41, gpu_temp=90.0))
    assert [(f.kind, f.step) for f in fuser.tick(44.0)] == [("thermal", 40)]


def test_an_unexplained_throughput_drop_is_reported() -> None:
    fuser = Fuser()
    fuser.add(_f("throughput_drop", JOB, 10))
    assert fuser.tick(12.0) == []  # held longer, waiting for a specific cause
    assert [f.kind for f in fuser.tick(30.0)] == ["throughput_drop"]


def test_flapping_subject_is_muted() -> None:
    fuser = Fuser(FusionPolicy(hold_steps=0, clear_steps=1, flap_max=2, flap_window=100))
    released = []
    for step in range(0, 60, 10):
        fuser.add(_f("thermal", R3, step))
        released += fuser.tick(float(step))
    assert len(released) == 2
    assert fuser.suppressed == 4


def test_node_finding_absorbs_its_ranks() -> None:
    fuser = Fuser()
    fuser.add(_f("slow_node", Subject(None, None, "n0"), 10))
    fuser.add(_f("slow_rank", R3, 11))
    assert [str(f.subject) for f in fuser.tick(13.0)] == ["node n0"]


class _Broken:
    name = "broken"

    def process(self, frame: Frame) -> Sequence[Finding]:
        raise ZeroDivisionError("boom")

    def poll(self, now: float) -> Sequence[Finding]:
        raise ZeroDivisionError("boom")


def test_a_failing_detector_is_counted_not_raised() -> None:
    pipe = DetectorPipeline(
        [_Broken(), PeerOutlier(persistence=1, warmup=0, offset_alpha=0)],
        FusionPolicy(hold_steps=0),
    )
    rng = np.random.default_rng(0)
    x = noisy(rng, 8)
    x[2] *= 2
    out = pipe.process_step(batch(1, {"compute_ms": x}))
    pipe.poll(5.0)
    assert [f.subject.rank for f in out] == [2]
    assert pipe.errors == {"broken": 9}  # 8 frames and one poll


def test_policy_validation() -> None:
    with pytest.raises(ValueError, match="clear_steps"):
        FusionPolicy(clear_steps=0)


def test_flush_releases_held_findings() -> None:
    pipe = DetectorPipeline([PeerOutlier(persistence=1, warmup=0, offset_alpha=0)])
    rng = np.random.default_rng(0)
    x = noisy(rng, 8)
    x[2] *= 2
    assert pipe.process_step(batch(1, {"compute_ms": x})) == []
    assert [f.kind for f in pipe.flush()] == ["slow_rank"]


def test_a_loss_spike_on_every_rank_is_one_job_finding() -> None:
    fuser = Fuser()
    for rank in range(4):
        fuser.add(_f("loss_spike", Subject(0, rank, "n0"), 10, loss=9.0))
    out = fuser.tick(12.0)
    assert [(f.kind, str(f.subject)) for f in out] == [("loss_spike", "job")]
    assert out[0].evidence["ranks_affected"] == 4
    assert fuser.add(_f("loss_spike", Subject(0, 7, "n1"), 13)) == []
    assert fuser.tick(16.0) == []


def test_frame_by_frame_pipeline_finds_every_fault_once() -> None:
    from detectors.config import DetectorsConfig
    from detectors.eval.generate import TraceSpec, generate
    from detectors.eval.metrics import score_trace
    from detectors.eval.runner import Emitted

    trace = generate(TraceSpec(nodes=4, ranks_per_node=4, seed=21))
    pipe = DetectorsConfig().build()
    emitted = []
    for step_batch in trace.batches():  # as the controller sees them: one frame per rank
        for frame in step_batch.frames():
            emitted += [Emitted(f, step_batch.step, step_batch.time) for f in pipe.process(frame)]
        emitted += [
            Emitted(f, step_batch.step, step_batch.time) for f in pipe.poll(step_batch.time)
        ]
    emitted += [Emitted(f, batch.step, batch.time) for f in pipe.flush()]
    result = score_trace(trace, emitted)
    assert [m.window.kind for m in result.matches if not m.found] == []
    assert [e.finding.kind for e in result.false_findings] == []


def test_a_stepless_lifecycle_frame_does_not_move_the_fusion_clock() -> None:
    pipeline = DetectorPipeline([PeerOutlier(persistence=1, min_ranks=4, warmup=0, offset_alpha=0)])
    found = []
    for step in range(2):
        for rank in range(4):
            compute = 300.0 if rank == 2 else 100.0 + rank
            frame = Frame(Subject(0, rank, "n0"), step, 1e9 + step, {"compute_ms": compute})
            found += pipeline.process(frame)
    assert found == []  # the finding of step 0 is held until step 2
    launched = Frame(Subject(0, 1, "n0"), None, 2e9, {"launched": 1.0})
    assert pipeline.process(launched) == []
    for rank in range(4):
        found += pipeline.process(Frame(Subject(0, rank, "n0"), 2, 1e9 + 2, {"compute_ms": 100.0}))
    assert [(f.kind, f.subject.rank, f.step) for f in found] == [("slow_rank", 2, 0)]


def test_a_finding_noted_from_outside_explains_symptoms_and_absorbs_duplicates() -> None:
    fuser = Fuser()
    fuser.note(_f("hang", R3, 10, Severity.CRITICAL))
    assert fuser.add(_f("hang", R3, 10, Severity.CRITICAL)) == []  # the same fault again
    assert fuser.add(_f("throughput_drop", JOB, 12, steps_shifted=2.0)) == []
    assert fuser.tick(40.0) == []
    assert [f.kind for f in fuser.add(_f("hang", Subject(0, 1, "n0"), 11, Severity.CRITICAL))] == [
        "hang"
    ]  # another rank is another fault


def test_a_noted_finding_absorbs_only_its_own_kind() -> None:
    fuser = Fuser()
    fuser.note(_f("nan", R3, 25, Severity.CRITICAL))
    assert fuser.add(_f("loss_spike", R3, 32)) == []  # held, not absorbed
    assert [f.kind for f in fuser.tick(34.0)] == ["loss_spike"]


def test_a_gradient_spike_caused_by_one_rank_s_loss_spike_is_merged_into_it() -> None:
    fuser = Fuser()
    fuser.add(_f("loss_spike", Subject(0, 1, "n0"), 32, loss=40.0))
    assert fuser.add(_f("grad_spike", JOB, 32, grad_norm=20.0)) == []
    (found,) = fuser.tick(34.0)
    assert (found.kind, found.subject.rank) == ("loss_spike", 1)
    assert found.evidence["grad_norm"] == 20.0


def test_a_gradient_spike_reported_before_its_cause_is_merged_into_it() -> None:
    fuser = Fuser()
    fuser.add(_f("grad_spike", Subject(0, 0, "n0"), 32, grad_norm=20.0))
    fuser.add(_f("loss_spike", Subject(0, 1, "n0"), 32, loss=40.0))
    (found,) = fuser.tick(34.0)
    assert (found.kind, found.subject.rank) == ("loss_spike", 1)


def test_a_generic_finding_waits_for_the_specific_one_on_its_subject() -> None:
    fuser = Fuser()
    fuser.add(_f("metric_outlier", R3, 10, gpu_util=30.0))
    assert fuser.tick(14.0) == []  # held: something more specific may still come
    fuser.add(_f("dataloader_stall", R3, 15, data_wait_ms=900.0))
    (found,) = fuser.tick(17.0)
    assert found.kind == "dataloader_stall"
    assert found.evidence["gpu_util"] == 30.0


def test_a_generic_finding_on_a_fail_slow_fault_still_on_is_its_effect() -> None:
    # A stalled rank's GPU idles as long as the stall lasts: its incident closes after
    # ``clear_steps`` quiet steps, yet an idle-GPU finding 25 steps on is still the stall's.
    fuser = Fuser()
    fuser.add(_f("dataloader_stall", R3, 100, data_wait_ms=900.0))
    assert [f.kind for f in fuser.tick(102.0)] == ["dataloader_stall"]
    assert fuser.tick(124.0) == []  # the stall's incident has closed
    assert fuser.add(_f("metric_outlier", R3, 125, gpu_util=77.0)) == []
    assert fuser.tick(150.0) == []
    # Another rank's, or one long after (past ``ongoing_window``), is its own.
    other = Subject(0, 4, "n0")
    fuser.add(_f("metric_outlier", other, 130, gpu_util=77.0))
    assert [(f.kind, f.subject.rank) for f in fuser.tick(151.0)] == [("metric_outlier", 4)]
    fuser.add(_f("metric_outlier", R3, 300, gpu_util=77.0))
    assert [(f.kind, f.subject.rank) for f in fuser.tick(321.0)] == [("metric_outlier", 3)]


def test_a_fault_found_again_by_another_detector_is_one_finding() -> None:
    # A live run's coarse and precise peer comparisons cross their bars at different steps
    # of one slowdown: the second, 30 steps on (after the incident closed), is the same
    # fault. The same detector firing again has re-armed on its own: a new fault.
    fuser = Fuser()
    fuser.add(replace(_f("slow_rank", R3, 60), detector="peer_outlier/quiet"))
    assert [f.kind for f in fuser.tick(62.0)] == ["slow_rank"]
    fuser.tick(85.0)  # closed
    assert fuser.add(replace(_f("slow_rank", R3, 90), detector="peer_outlier")) == []
    assert fuser.tick(95.0) == []
    assert fuser.suppressed == 1
    fuser.add(replace(_f("slow_rank", R3, 120), detector="peer_outlier/quiet"))
    assert [(f.kind, f.step) for f in fuser.tick(122.0)] == [("slow_rank", 120)]
    other = Subject(0, 4, "n0")  # another rank's is its own fault
    fuser.add(replace(_f("slow_rank", other, 125), detector="peer_outlier"))
    assert [(f.kind, f.subject.rank) for f in fuser.tick(127.0)] == [("slow_rank", 4)]
