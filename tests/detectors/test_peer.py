"""Peer outliers. Tests of a fault present from the first step switch the rank's learnt
offset off (``offset_alpha=0``): with it, a rank so from the start is that rank's nature."""

from __future__ import annotations

import numpy as np
import pytest

from collector.types import Frame, Subject
from detectors.peer import PeerOutlier
from tests.detectors._batches import batch, noisy


def _run(
    det: PeerOutlier, steps: int, slow: dict[int, float], n: int = 32, start: int = 0, seed: int = 0
) -> list:
    rng = np.random.default_rng(seed)
    found = []
    for s in range(start, start + steps):
        x = noisy(rng, n)
        for rank, factor in slow.items():
            x[rank] *= factor
        found += det.process_step(batch(s, {"compute_ms": x}))
    return found


def test_slow_rank_fires_once_after_persistence_and_names_the_rank() -> None:
    det = PeerOutlier(offset_alpha=0, persistence=3)
    found = _run(det, 20, {7: 1.15})
    assert [(f.kind, f.subject.rank, f.step) for f in found] == [("slow_rank", 7, 2)]
    assert found[0].evidence["relative_shift"] > 0.1


def test_a_ten_percent_shift_fires_but_two_percent_does_not() -> None:
    assert _run(PeerOutlier(offset_alpha=0), 10, {3: 1.10})
    assert not _run(PeerOutlier(), 50, {3: 1.02})


def test_healthy_fleet_and_common_slowdowns_do_not_fire() -> None:
    det = PeerOutlier()
    rng = np.random.default_rng(1)
    for s in range(300):
        factor = 2.5 if s % 50 == 49 else 1.0  # a checkpoint step slows every rank
        x = noisy(rng, 64) * factor
        assert not det.process_step(batch(s, {"compute_ms": x}))


def test_several_ranks_of_one_node_give_one_node_finding() -> None:
    found = _run(PeerOutlier(offset_alpha=0), 10, {4: 1.3, 5: 1.3, 6: 1.3, 7: 1.3})
    assert [(f.kind, str(f.subject)) for f in found] == [("slow_node", "node n1")]
    assert found[0].evidence["ranks_outlying"] == 4


def test_hysteresis_refires_only_after_the_rank_recovers() -> None:
    det = PeerOutlier(offset_alpha=0, persistence=2, clear=3)
    first = _run(det, 10, {2: 1.3})
    again = _run(det, 10, {2: 1.3}, start=10, seed=1)
    assert len(first) == 1
    assert not again
    _run(det, 5, {}, start=20, seed=2)
    assert len(_run(det, 5, {2: 1.3}, start=25, seed=3)) == 1


def test_low_direction_features_fire_on_drops() -> None:
    rng = np.random.default_rng(0)
    det = PeerOutlier(offset_alpha=0, persistence=1)
    clock = noisy(rng, 16, 1980.0, 0.003)
    clock[9] *= 0.8
    found = det.process_step(batch(0, {"sm_clock": clock}))
    assert [(f.kind, f.subject.rank) for f in found] == [("thermal", 9)]


def test_frame_path_matches_the_step_path() -> None:
    det = PeerOutlier(offset_alpha=0, persistence=1)
    found = []
    for s in range(3):
        for r in range(8):
            value = 150.0 if r == 3 else 100.0 + r % 2
            found += det.process(
                Frame(Subject(0, r, f"n{r // 4}"), s, float(s), {"compute_ms": value})
            )
    found += det.flush()
    assert [(f.kind, f.subject.rank, f.step) for f in found] == [("slow_rank", 3, 0)]


def test_ranks_joining_later_are_tracked() -> None:
    det = PeerOutlier(offset_alpha=0, persistence=2)
    rng = np.random.default_rng(0)
    det.process_step(batch(0, {"compute_ms": noisy(rng, 8)}))
    x = noisy(rng, 12)
    x[10] *= 1.5
    det.process_step(batch(1, {"compute_ms": x}))
    found = det.process_step(batch(2, {"compute_ms": x}))
    assert [f.subject.rank for f in found] == [10]


def test_a_whole_replica_across_nodes_gives_one_replica_finding() -> None:
    rng = np.random.default_rng(0)
    det = PeerOutlier(offset_alpha=0)
    found = []
    for s in range(6):
        x = noisy(rng, 32)
        x[:8] *= 1.3  # replica 0 = ranks 0-7 on nodes n0 and n1
        b = batch(s, {"compute_ms": x})
        b = type(b)(
            b.step, b.time, b.ranks, b.nodes, (b.ranks >= 8).astype(int), b.features, b.values
        )
        found += det.process_step(b)
    assert [(f.kind, str(f.subject)) for f in found] == [("slow_replica", "replica 0")]
    assert found[0].evidence["ranks_outlying"] == 8


def test_interleaved_frames_of_neighbouring_steps_are_compared_per_step() -> None:
    det = PeerOutlier(offset_alpha=0, persistence=2)
    found = []
    # Rank r reports step s at time s + r / 5: fast ranks run a step ahead of slow ones.
    events = sorted((s + r / 5, s, r) for s in range(6) for r in range(8))
    for t, s, r in events:
        value = 150.0 if r == 6 else 100.0 + r % 2
        found += det.process(Frame(Subject(0, r, f"n{r // 4}"), s, t, {"compute_ms": value}))
    found += det.flush()
    assert [(f.kind, f.subject.rank, f.step) for f in found] == [("slow_rank", 6, 1)]


def _fleet(steps: int, speed: np.ndarray, change: dict[int, float], at: int, seed: int = 0):
    """Compute times of GPUs with fixed speeds; ``change`` multiplies ranks from ``at``."""
    rng = np.random.default_rng(seed)
    for s in range(steps):
        x = 1000.0 * speed * (1.0 + 0.015 * rng.standard_normal(len(speed)))
        for rank, factor in change.items():
            if s >= at:
                x[rank] *= factor
        yield batch(s, {"compute_ms": x}, ranks_per_node=8)


def test_a_gpu_always_slower_is_no_outlier_but_one_that_became_slower_is() -> None:
    speed = np.ones(32)
    speed[[3, 20]] = 1.03, 1.07  # fixed heterogeneity: always 3 % and 7 % slower
    det, raw = PeerOutlier(min_shift=0.05), PeerOutlier(min_shift=0.05, offset_alpha=0)
    found, naive = [], []
    for b in _fleet(300, speed, {11: 1.10}, at=150):
        found += det.process_step(b)
        naive += raw.process_step(b)
    (finding,) = found
    assert finding.subject.rank == 11
    assert 150 < (finding.step or 0) < 170  # a 10 % slowdown found within 20 steps
    assert finding.evidence["compute_ms_usual_ratio"] == pytest.approx(1.0, abs=0.02)
    assert 20 in {f.subject.rank for f in naive}  # compared raw, the 7 % GPU is an outlier


def test_the_slow_gpu_s_own_offset_does_not_hide_its_slowdown() -> None:
    speed = np.ones(32)
    speed[20] = 1.07
    det = PeerOutlier()
    found = [f for b in _fleet(200, speed, {20: 1.10}, at=100) for f in det.process_step(b)]
    assert [f.subject.rank for f in found] == [20]
    assert 100 < (found[0].step or 0) < 120
    assert found[0].evidence["compute_ms_usual_ratio"] == pytest.approx(1.07, abs=0.01)


def test_ranks_warming_up_after_a_launch_take_no_part() -> None:
    det = PeerOutlier(warmup=20, offset_alpha=0, persistence=1)
    for s in range(30):
        x = np.full(8, 100.0)
        x[2] = 200.0 if s < 20 else 100.0  # a slow first steps after its launch
        b = batch(s, {"compute_ms": x, "since_launch": np.full(8, float(s))})
        assert not det.process_step(b)


def test_persistence_counts_the_reports_of_a_feature_not_other_observations() -> None:
    det = PeerOutlier(offset_alpha=0, persistence=3)
    found = []
    for s in range(4):
        clock = np.full(16, 1980.0)
        clock[5] = 1700.0
        found += det.process_step(batch(s, {"sm_clock": clock}))  # a GPU scrape
        found += det.process_step(batch(s, {"compute_ms": np.full(16, 100.0)}))  # a step
    assert [(f.kind, f.subject.rank, f.step) for f in found] == [("thermal", 5, 2)]


def _data_waits(step_s: float, extra_ms: float, steps: int = 120, at: int = 60):
    """16 ranks waiting 10 ms for data (steps of ``step_s``); rank 9 waits ``extra_ms``
    more from step ``at``."""
    rng = np.random.default_rng(4)
    for s in range(steps):
        wait = 10.0 * (1.0 + 0.05 * rng.standard_normal(16))
        if s >= at:
            wait[9] += extra_ms
        yield batch(s, {"data_wait_ms": wait, "step_time": np.full(16, step_s)})


@pytest.mark.parametrize(("step_s", "fires"), [(3.0, False), (0.5, True)])
def test_a_data_wait_must_cost_a_share_of_the_step(step_s: float, fires: bool) -> None:
    # 40 ms more than its peers' 10 ms: five times their wait, 1.3 % of a 3 s step (a
    # loader hiccup, no stall) and 8 % of a 0.5 s one.
    det = PeerOutlier()
    found = [f for b in _data_waits(step_s, 40.0) for f in det.process_step(b)]
    assert [(f.kind, f.subject.rank) for f in found] == ([("dataloader_stall", 9)] if fires else [])


def test_offsets_of_a_skewed_feature_stay_relative_to_the_median_rank() -> None:
    # Data waits drawn from an exponential: a rank's mean over the peers' median is about
    # 1.4. Learnt without centring, every factor crept up together (2,000 times in 400
    # steps) and the divided waits shrank below the floors, hiding a 1 s stall.
    rng = np.random.default_rng(5)
    det = PeerOutlier()
    found = []
    for s in range(500):
        wait = 30.0 * rng.exponential(1.0, 16)
        if s >= 450:
            wait[9] += 1000.0
        b = batch(s, {"data_wait_ms": wait, "step_time": np.full(16, 3.0)})
        found += det.process_step(b)
    factors = det.core.offsets.factor[:, det.core.names.index("data_wait_ms")]
    assert np.median(factors) == pytest.approx(1.0, abs=0.01)
    assert [(f.kind, f.subject.rank) for f in found] == [("dataloader_stall", 9)]
