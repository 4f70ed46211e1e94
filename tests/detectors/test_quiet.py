"""The precise peer comparison counts only while the job's own timings are quiet."""

from __future__ import annotations

import numpy as np
import pytest

from detectors.config import DetectorsConfig, DetectorSpec
from detectors.errors import DetectorError
from detectors.quiet import QuietJob
from tests.detectors._batches import batch


def _job(steps: int, jitter: float, slow: dict[int, float], at: int, seed: int = 0, calm_from=None):
    """Compute times of 16 ranks (nodes of 4): each step, every rank's time times a
    log-normal factor of ``jitter`` (0.01 from step ``calm_from`` on, when given);
    ``slow`` multiplies ranks from step ``at``."""
    rng = np.random.default_rng(seed)
    speed = 1.0 + 0.015 * rng.standard_normal(16)  # each GPU's own fixed speed
    for s in range(steps):
        noise = 0.01 if calm_from is not None and s >= calm_from else jitter
        x = 1000.0 * speed * np.exp(noise * rng.standard_normal(16))
        for rank, factor in slow.items():
            if s >= at:
                x[rank] *= factor
        yield batch(s, {"compute_ms": x}, ranks_per_node=4)


def _run(det: QuietJob, batches) -> list:
    return [f for b in batches for f in det.process_step(b)]


def test_a_ten_percent_slow_rank_of_a_quiet_job_is_passed_on() -> None:
    det = QuietJob(max_noise=0.1)
    found = _run(det, _job(200, 0.01, {5: 1.10}, at=100))
    assert [(f.kind, f.subject.rank) for f in found] == [("slow_rank", 5)]
    assert 100 < (found[0].step or 0) <= 120
    assert det.noise is not None
    assert det.noise < 0.05


def test_a_noisy_job_s_findings_are_withheld() -> None:
    # CPU-like jitter: half a rank's time now and then; a rank five times as slow is found by
    # the inner comparison, but no precise bar is trusted on such a host.
    det = QuietJob(max_noise=0.1)
    found = _run(det, _job(200, 0.35, {5: 5.0}, at=100))
    assert found == []
    assert det.dropped >= 1  # the inner detector did find it
    assert det.noise is not None
    assert det.noise > 0.3


def test_a_fault_from_before_the_first_measure_is_passed_when_the_gate_opens() -> None:
    # The inner comparison finds the rank within a few steps (after its own warm-up of 20)
    # and fires once; the gate first measures at step 39 and finds the job quiet: the
    # finding passes then, with its step.
    det = QuietJob(max_noise=0.1, window=40, warmup=0)
    found = []
    for s, b in enumerate(_job(60, 0.01, {5: 1.10}, at=25)):
        got = det.process_step(b)
        found += got
        assert not got or s == 39, s
    assert [(f.kind, f.subject.rank) for f in found] == [("slow_rank", 5)]
    assert 25 <= (found[0].step or 0) < 39
    assert found[0].detector == "peer_outlier/quiet"
    assert det.dropped == 0


def test_a_finding_withheld_before_the_measured_steps_stays_withheld() -> None:
    # Noisy while the rank was found (five times as slow from step 30), quiet from step 60:
    # the measure that opens the gate covers the quiet steps only.
    det = QuietJob(max_noise=0.1, window=20, warmup=0)
    found = _run(det, _job(120, 0.35, {5: 5.0}, at=30, calm_from=60))
    assert found == []
    assert det.quiet
    assert det.dropped >= 1


def test_a_lasting_shift_of_a_whole_node_does_not_make_the_job_noisy() -> None:
    det = QuietJob(max_noise=0.1)
    found = _run(det, _job(200, 0.01, dict.fromkeys(range(4, 8), 1.3), at=100))
    assert det.noise is not None
    assert det.noise < 0.05
    assert [(f.kind, f.subject.node) for f in found] == [("slow_node", "n1")]


def test_nothing_passes_before_the_first_measure() -> None:
    det = QuietJob(max_noise=0.1, window=20, warmup=0)
    batches = list(_job(25, 0.01, {}, at=0))
    for b in batches[:19]:
        det.process_step(b)
        assert det.noise is None
        assert not det.quiet
    for b in batches[19:]:
        det.process_step(b)
    assert det.quiet


def test_ranks_warming_up_are_left_out_of_the_measure() -> None:
    det = QuietJob(max_noise=0.1, window=8, warmup=20, every=1)
    for s, b in enumerate(_job(30, 0.01, {}, at=0)):
        warming = np.full(16, float(s))  # every rank launched at step 0
        b = batch(s, {"compute_ms": b.column("compute_ms"), "since_launch": warming})
        det.process_step(b)
        assert (det.noise is None) == (s < 20 + 8 - 1)


@pytest.mark.parametrize(
    "params",
    [{"max_noise": 0}, {"window": 3}, {"every": 0}, {"max_ranks": 2}, {"detector": "xid"}],
)
def test_bad_parameters_are_refused(params: dict) -> None:
    with pytest.raises(DetectorError):
        QuietJob(**params)


def test_it_is_built_from_a_config_with_the_inner_detector_s_parameters() -> None:
    spec = DetectorSpec(
        "when_quiet", {"detector": "peer_outlier", "params": {"z": 9.0}, "max_noise": 0.2}
    )
    (det,) = DetectorsConfig((spec,)).build().detectors
    assert isinstance(det, QuietJob)
    assert det.inner.z == 9.0
    assert det.max_noise == 0.2
