"""The peer detector's sustained bar: a modest shift held report after report, under
heavy-tailed noise, on GPUs that each have their own fixed speed."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from detectors.peer import PeerOutlier
from tests.detectors._batches import batch

RANKS = 32  # four nodes of eight


def _fleet(seed: int) -> tuple[np.random.Generator, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng, 1.0 + rng.uniform(-0.04, 0.04, RANKS)  # each GPU's own speed


def _compute(rng: np.random.Generator, speed: np.ndarray, step: int) -> np.ndarray:
    """Student-t noise of three degrees of freedom (2 % scale) on each GPU's speed; every
    50th step a checkpoint slows every rank threefold."""
    noise = 1.0 + 0.02 * np.clip(rng.standard_t(3, RANKS), -10, 10)
    return 900.0 * speed * noise * (3.0 if step % 50 == 49 else 1.0)


def _run(det: PeerOutlier, seed: int, slow: dict[int, float], steps: int = 260) -> list:
    rng, speed = _fleet(seed)
    found = []
    for s in range(steps):
        x = _compute(rng, speed, s)
        if s >= 200:
            for rank, factor in slow.items():
                x[rank] *= factor
        found += det.process_step(batch(s, {"compute_ms": x}, ranks_per_node=8))
    return found


def test_a_ten_percent_slowdown_under_heavy_tailed_noise_is_found_within_20_steps() -> None:
    for seed in range(4):
        found = _run(PeerOutlier(), seed, {5: 1.10})
        assert [(f.kind, f.subject.rank) for f in found] == [("slow_rank", 5)], seed
        assert found[0].step is not None
        assert 200 <= found[0].step < 220, (seed, found[0].step)


def test_the_single_report_bar_alone_misses_it() -> None:
    # What the sustained bar adds: at z 6 per report the same shift goes unseen.
    missed = [_run(PeerOutlier(sustained_z=0), seed, {5: 1.10}) for seed in range(4)]
    assert sum(len(m) for m in missed) < 4


def test_a_slower_node_is_one_node_finding() -> None:
    found = _run(PeerOutlier(), 7, {r: 1.12 for r in range(16, 24)})
    assert [(f.kind, str(f.subject)) for f in found] == [("slow_node", "node n2")]


def test_a_healthy_heterogeneous_heavy_tailed_fleet_draws_nothing() -> None:
    for seed in range(3):
        assert not _run(PeerOutlier(), 100 + seed, {}, steps=1500), seed


def test_a_three_percent_change_is_learnt_not_reported() -> None:
    # A GPU settling 3 % slower is inside the 6 % floor: no finding, however long.
    assert not _run(PeerOutlier(), 11, {9: 1.03}, steps=600)


def _with_temperatures(
    seed: int, steps: int, temp_sd: float, change: Callable[[int, np.ndarray, np.ndarray], None]
) -> list:
    """Compute and GPU temperature of every rank (each GPU its own usual temperature);
    ``change(step, compute, temperature)`` puts a fault in."""
    det = PeerOutlier()
    rng, speed = _fleet(seed)
    temps = 55.0 + rng.uniform(-6, 6, RANKS)
    found = []
    for s in range(steps):
        x = _compute(rng, speed, s)
        t = temps + rng.normal(0, temp_sd, RANKS)
        change(s, x, t)
        found += det.process_step(batch(s, {"compute_ms": x, "gpu_temp": t}, ranks_per_node=8))
    return found


def test_a_thermal_ranks_slower_compute_is_not_a_second_finding() -> None:
    def throttled(s: int, x: np.ndarray, t: np.ndarray) -> None:
        if s >= 200:
            x[5] /= 0.92  # its clock throttled by 8 %
            t[5] += 10.0

    found = _with_temperatures(3, 400, 0.7, throttled)
    assert [(f.kind, f.subject.rank) for f in found] == [("thermal", 5)]


def test_a_fast_gpus_longer_wait_in_the_all_reduce_is_its_nature() -> None:
    # comm_ms is compared raw (no offsets): the fastest GPU waits longest for the slowest
    # every step, a lasting difference that only the sustained bar could take for a fault.
    det = PeerOutlier()
    rng, speed = _fleet(5)
    speed[7] = 0.88  # 12 % faster than the rest: it waits about 100 ms more every step
    found = []
    for s in range(1500):
        arrive = _compute(rng, speed, s)
        comm = arrive.max() - arrive + 120.0 * (1.0 + 0.02 * rng.standard_normal(RANKS))
        found += det.process_step(batch(s, {"comm_ms": comm}, ranks_per_node=8))
    assert not found


def _host_of_four(seed: int, steps: int, slow_link_from: int | None = None) -> list:
    """One host of four ranks in a synchronous job: rank 0's GPU 12 % faster than the
    others, so it waits about 100 ms longer in every all-reduce; from ``slow_link_from``
    on, rank 2's own collective takes 150 ms longer (its compute unchanged)."""
    rng = np.random.default_rng(seed)
    speed = np.array([0.88, 1.0, 1.01, 0.99])
    det, found = PeerOutlier(), []
    for s in range(steps):
        arrive = 900.0 * speed * (1.0 + 0.02 * np.clip(rng.standard_t(3, 4), -10, 10))
        comm = arrive.max() - arrive + 120.0 * (1.0 + 0.02 * rng.standard_normal(4))
        if slow_link_from is not None and s >= slow_link_from:
            comm[2] += 150.0
        columns = {"compute_ms": arrive, "comm_ms": comm}
        found += [(s, f) for f in det.process_step(batch(s, columns, ranks_per_node=4))]
    return found


def test_on_a_host_of_four_a_fast_gpus_longer_wait_is_no_slow_link() -> None:
    # Among four peers the fast GPU's wait stands at robust z 7 to 10 now and then; less
    # the compute it saved, its collective takes what the others' do.
    for seed in range(3):
        assert _host_of_four(seed, 1500) == []


def test_a_slow_link_is_found_net_of_the_ranks_compute() -> None:
    found = _host_of_four(0, 400, slow_link_from=300)
    assert [(f.kind, f.subject.rank) for _, f in found] == [("nic_degradation", 2)]
    assert 300 <= found[0][0] <= 320


def test_an_offset_learnt_on_a_relaunched_ranks_first_reports_is_not_a_shift() -> None:
    # Rank 9 is relaunched at step 300 and runs 7 % fast for its first ten reports after
    # the warm-up, then as before: an offset resting on those ten alone would make it look
    # 7.5 % slow for good, a lasting shift to the sustained bar.
    det = PeerOutlier()
    rng, speed = _fleet(9)
    found = []
    for s in range(700):
        x = _compute(rng, speed, s)
        since = np.full(RANKS, float(s))
        if s >= 300:
            since[9] = s - 300.0
            if 320 <= s < 330:
                x[9] *= 0.93
        columns = {"compute_ms": x, "since_launch": since}
        found += det.process_step(batch(s, columns, ranks_per_node=8))
    assert not found


def test_a_slow_rank_after_its_thermal_fault_ended_is_found() -> None:
    # Rank 5 runs hot (+12 °C) from step 100 to 160 and stays 2.5 °C warmer after it (under
    # the 5 °C floor: its offset learns it in the end); at step 450 it becomes 12 % slower.
    # Its thermal cell must have re-armed by then, or the slower compute is taken for the
    # thermal finding's effect.
    def hot_then_slow(s: int, x: np.ndarray, t: np.ndarray) -> None:
        if 100 <= s < 160:
            t[5] += 12.0
        elif s >= 160:
            t[5] += 2.5
        if s >= 450:
            x[5] *= 1.12

    found = _with_temperatures(4, 520, 0.4, hot_then_slow)
    assert [(f.kind, f.subject.rank) for f in found] == [("thermal", 5), ("slow_rank", 5)]
    assert found[1].step is not None
    assert 450 <= found[1].step < 470
