"""The detectors' edge: derived features, counter rates, warm-up after launches."""

from __future__ import annotations

import math

import numpy as np

from collector.types import Frame, Subject
from detectors.edge import Edge
from tests.detectors._batches import batch


def test_compute_is_the_step_less_collectives_data_and_checkpoint() -> None:
    b = batch(
        3,
        {
            "step_time": np.array([1.0, 1.2]),
            "collective_time": np.array([0.2, 0.1]),  # the hook's names, in seconds
            "section.data": np.array([0.05, 0.3]),
            "section.checkpoint": np.array([0.1, 0.1]),
        },
    )
    out = Edge().batch(b)
    assert "collective_time" not in out.features
    assert out.column("compute_ms").tolist() == [650.0, 700.0]
    assert out.column("comm_ms").tolist() == [200.0, 100.0]


def test_a_part_of_the_step_one_rank_did_not_report_leaves_its_compute_unknown() -> None:
    # Rank 1's collective time is missing from the step its peers reported it in: its
    # compute is unknown, not the whole step (that made a rank missing a few rows slow).
    # A part no rank of the step reported (no data wait at all) takes nothing out.
    b = batch(
        3,
        {
            "step_time": np.array([1.0, 1.0, 1.0]),
            "comm_ms": np.array([200.0, np.nan, 300.0]),
            "data_wait_ms": np.full(3, np.nan),
        },
    )
    compute = Edge().batch(b).column("compute_ms")
    assert compute[0] == 800.0
    assert compute[2] == 700.0
    assert math.isnan(compute[1])


def test_counters_become_rates_and_a_reset_is_no_negative_rate() -> None:
    edge = Edge()
    values = [[100.0, 100.0], [160.0, 100.0], [10.0, 110.0]]  # rank 0's counter resets
    rates = []
    for i, row in enumerate(values):
        b = batch(i, {"host_net_rx_errors_total": np.array(row)}, time=10.0 * i)
        rates.append(edge.batch(b).column("nic_rx_errors_rate").tolist())
    assert all(math.isnan(r) for r in rates[0])  # no earlier report
    assert rates[1] == [6.0, 0.0]
    assert math.isnan(rates[2][0])
    assert rates[2][1] == 1.0


def test_thermal_throttling_is_read_from_the_reason_bits() -> None:
    b = batch(0, {"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": np.array([0.0, 0x40, 0x80, 0x20])})
    assert Edge().batch(b).column("throttle_thermal").tolist() == [0.0, 1.0, 0.0, 1.0]


def test_since_launch_counts_steps_and_starts_again_at_a_launch_or_a_step_back() -> None:
    edge = Edge()
    seen = []
    for step in (0, 1, 2, 3, 1, 2):  # a restart from a checkpoint goes back to step 1
        out = edge.batch(batch(step, {"step_time": np.ones(4)}))
        seen.append(out.column("since_launch")[0])
    assert seen == [1.0, 2.0, 3.0, 4.0, 1.0, 2.0]
    launched = Frame(Subject(0, 2, "n0"), None, 9.0, {"launched": 1.0})
    edge.frame(launched)
    out = edge.batch(batch(3, {"step_time": np.ones(4)}))
    assert out.column("since_launch").tolist() == [3.0, 3.0, 1.0, 3.0]


def test_a_scrape_of_the_step_in_progress_before_the_last_completion_is_no_restart() -> None:
    """A node's scraper a little behind stamps its GPU reading with step k before rank 0
    reported step k - 1 complete: the step numbers go back, but nothing restarted. Taken
    for a restart, every such scrape kept the rank warming (no outlier: a rank 50 % slower
    was never found)."""
    edge = Edge()
    seen = []
    for step in range(1, 8):
        edge.batch(batch(step + 1, {"gpu_temp": np.full(4, 60.0)}))  # the scrape, early
        out = edge.batch(batch(step, {"step_time": np.ones(4)}))  # then the completion
        seen.append(out.column("since_launch")[0])
    assert seen == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    out = edge.batch(batch(3, {"step_time": np.ones(4)}))  # a completed step going back is
    assert out.column("since_launch")[0] == 1.0  # a restart from a checkpoint


def test_a_frame_gets_the_same_features_as_a_step() -> None:
    edge = Edge()
    frame = Frame(
        Subject(0, 1, "n0"),
        4,
        1.0,
        {"step_time": 0.5, "collective_time": 0.1, "DCGM_FI_DEV_FB_USED": 1024.0},
    )
    values = edge.frame(frame).values
    assert values["compute_ms"] == 400.0
    assert values["mem_used"] == 1024 * 2**20 / 1e9
    assert values["since_launch"] == 1.0
