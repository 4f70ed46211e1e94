"""A rank standing out against its host (the controller's judge of the hosts' outlier rows):
a data wait must also cost a share of the step."""

from __future__ import annotations

from collector.types import Frame, Subject
from detectors.standout import StandsOut


def _found(det: StandsOut, rows: list[dict[str, float]]) -> list:
    return [f for s, v in enumerate(rows) for f in det.process(Frame(Subject(0, 5), s, 0.0, v))]


def test_a_data_wait_that_costs_little_of_a_long_step_is_no_stall() -> None:
    # 40 ms against the host's 20 on a 3.5 s step: twice the host's, 20 ms over, 0.6 %.
    row = {"data_wait_ms": 40.0, "data_wait_ms.host_median": 20.0, "step_time.host_median": 3.5}
    assert _found(StandsOut(), [row] * 5) == []
    # the same wait on a 0.5 s step is 4 % of it: a stall
    short = {**row, "step_time.host_median": 0.5}
    assert [(f.kind, f.step) for f in _found(StandsOut(), [short] * 5)] == [("dataloader_stall", 3)]


def test_a_stall_that_costs_its_share_is_found_and_compute_has_no_share() -> None:
    stall = {"data_wait_ms": 400.0, "data_wait_ms.host_median": 20.0, "step_time": 3.5}
    assert [f.kind for f in _found(StandsOut(), [stall] * 4)] == ["dataloader_stall"]
    assert _found(StandsOut(), [stall] * 3) == []  # three steps: a hiccup
    slow = {"compute_ms": 130.0, "compute_ms.host_median": 80.0, "step_time.host_median": 9.0}
    assert [f.kind for f in _found(StandsOut(), [slow] * 4)] == ["slow_rank"]
    assert _found(StandsOut(step_share={}), [{**stall, "data_wait_ms": 41.0}] * 4) != []


def test_a_long_stall_is_one_finding_and_a_new_one_later_another() -> None:
    stall = {"data_wait_ms": 900.0, "data_wait_ms.host_median": 50.0, "step_time": 3.5}
    calm = {"data_wait_ms": 50.0, "data_wait_ms.host_median": 50.0, "step_time": 3.5}
    rows = [stall] * 120 + [calm] * 10 + [stall] * 5  # one stall of 120 steps, then another
    assert [f.step for f in _found(StandsOut(), rows)] == [3, 133]
