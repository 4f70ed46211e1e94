from __future__ import annotations

import math

import numpy as np

from collector.types import Frame, Subject
from collector.xid import XID_CATALOGUE
from detectors.hang import CollectiveHang
from detectors.rules import CollectiveTimeout, MemoryFatal, NonFiniteLoss, XidError
from detectors.stepbatch import StepBatch
from detectors.types import Severity
from tests.detectors._batches import batch


def _frame(values: dict[str, float], rank: int = 1, step: int = 3) -> Frame:
    return Frame(Subject(0, rank, "n0"), step, 0.0, values)


def test_xid_severity_follows_the_catalogue_and_repeats_are_ignored() -> None:
    det = XidError()
    assert det.process(_frame({"xid": 79}))[0].severity == Severity.CRITICAL
    assert det.process(_frame({"xid": 79})) == ()
    assert det.process(_frame({"xid": 92}))[0].severity == Severity.WARN
    assert det.process(_frame({"xid": 45})) == ()  # info is below the default minimum
    assert XidError("info").process(_frame({"xid": 45}))[0].severity == Severity.INFO


def test_the_detector_and_the_alert_rules_share_one_xid_catalogue() -> None:
    named = {"fatal": Severity.CRITICAL, "warn": Severity.WARN, "info": Severity.INFO}
    for code, info in XID_CATALOGUE.items():
        found = XidError("info").process(_frame({"xid": float(code)}))
        assert found[0].severity == named[info.severity], code


def test_double_bit_ecc_rising_and_row_remap_failure_are_fatal() -> None:
    det = MemoryFatal()
    assert det.process(_frame({"ecc_dbe": 0.0})) == ()
    assert det.process(_frame({"ecc_dbe": 2.0}))[0].kind == "ecc"
    assert det.process(_frame({"ecc_dbe": 2.0})) == ()
    assert det.process(_frame({"row_remap_failure": 1.0}))[0].evidence["row_remap_failure"] == 1


def test_collective_timeout_event() -> None:
    assert CollectiveTimeout().process(_frame({"collective_timeout": 1.0}))[0].kind == (
        "collective_timeout"
    )
    assert CollectiveTimeout().process(_frame({"loss": 1.0})) == ()


def test_non_finite_loss_step_path_tells_nan_from_missing() -> None:
    values = np.array([[1.0, 1.0], [math.nan, 1.0], [math.nan, math.inf]])
    present = np.array([[True, True], [True, True], [False, True]])
    b = StepBatch(
        5,
        1.0,
        np.arange(3),
        np.array(["n0"] * 3, dtype=object),
        np.zeros(3, int),
        ("loss", "grad_norm"),
        values,
        present,
    )
    (found,) = NonFiniteLoss().process_step(b)
    # Rank 0's NaN is missing, not reported; rank 2 only got a non-finite gradient norm.
    assert found.subject.rank == 1
    assert math.isnan(found.evidence["loss"])
    assert found.evidence["ranks_affected"] == 2.0
    assert found.evidence["affected_rank_0"] == 2.0


def _steps(det: CollectiveHang, n: int, steps: int) -> float:
    for s in range(steps):
        det.process_step(batch(s, {"step_time": np.full(n, 1.0)}, time=float(s)))
    return float(steps - 1)


def _stuck(det: CollectiveHang, joined: np.ndarray, t: float) -> list:
    return list(det.process_step(batch(99, {"in_collective": joined}, time=t)))


def test_hang_names_the_rank_that_never_joined() -> None:
    det = CollectiveHang(k=2.0)
    t = _steps(det, 8, 10)
    joined = np.ones(8)
    joined[5] = 0
    assert _stuck(det, joined, t + 1.0) == []
    found = _stuck(det, joined, t + 2.0)
    assert [(f.kind, f.subject.rank) for f in found] == [("hang", 5)]
    assert found[0].evidence["ranks_missing"] == 1
    assert found[0].evidence["missing_rank_0"] == 5
    assert _stuck(det, joined, t + 3.0) == []  # one finding per hang


def test_hang_localises_to_a_node_or_the_job() -> None:
    det = CollectiveHang()
    t = _steps(det, 8, 10)
    joined = np.ones(8)
    joined[4:8] = 0
    assert str(_stuck(det, joined, t + 3.0)[0].subject) == "node n1"
    det = CollectiveHang()
    t = _steps(det, 8, 10)
    assert str(_stuck(det, np.zeros(8), t + 3.0)[0].subject) == "job"


def test_no_hang_while_steps_complete_and_rearmed_after_progress() -> None:
    det = CollectiveHang()
    _steps(det, 4, 30)
    assert det.poll(29.5) == ()
    assert len(det.poll(40.0)) == 1
    det.process_step(batch(30, {"step_time": np.full(4, 1.0)}, time=41.0))
    assert len(det.poll(45.0)) == 1


def test_silence_with_nobody_waiting_must_outlast_twice_the_longest_step() -> None:
    """Every rank silent through a long checkpoint is no hang: nobody waits in a collective.
    The same silence with ranks waiting for one that never joined is."""
    for joined, quiet_at, hung_at in (
        (np.zeros(8), 11.5, 12.5),
        (np.r_[np.ones(7), 0.0], 1.5, 2.5),
    ):
        det = CollectiveHang(k=2.0)
        t = _steps(det, 8, 10)
        det.process_step(batch(10, {"step_time": np.full(8, 6.0)}, time=t + 6.0))  # a save
        t += 6.0
        assert _stuck(det, joined, t + quiet_at) == []
        (found,) = _stuck(det, joined, t + hung_at)
        assert found.kind == "hang"
        assert found.evidence.get("longest_step_s") == (6.0 if not joined.any() else None)


def _rank_frame(rank: int, step: int | None, t: float, **values: float) -> Frame:
    return Frame(Subject(rank // 2, rank, f"n{rank // 2}"), step, t, values)


def test_exited_ranks_leave_the_wait_for_graph_and_launched_ones_get_a_grace() -> None:
    det = CollectiveHang(k=2.0, startup_grace_s=30.0)
    for s in range(5):
        for r in range(4):
            det.process(_rank_frame(r, s, float(s), step_time=1.0))
    for r in range(4):  # the job ends: every rank exits
        det.process(_rank_frame(r, 4, 4.5, exit_code=0.0))
    assert det.poll(20.0) == ()
    for r in range(4):  # relaunched: start-up is slow, not a hang
        det.process(_rank_frame(r, None, 21.0, launched=1.0))
    assert det.poll(40.0) == ()
    for r in (0, 1, 3):
        det.process(_rank_frame(r, 5, 42.0, step_time=1.0))
        det.process(_rank_frame(r, 6, 43.0, in_collective=1.0))
    assert det.poll(60.0) == ()  # rank 2 is still within its start-up grace
    # Rank 2 never stepped after its launch: once the grace is over, it is the hang.
    found = det.poll(75.0)
    assert [(f.kind, f.subject) for f in found] == [("hang", Subject(1, 2, "n1"))]


def test_an_exit_in_a_step_batch_is_not_taken_for_silence() -> None:
    det = CollectiveHang()
    t = _steps(det, 4, 10)
    exits = batch(10, {"exit_code": np.zeros(4)}, time=t + 5.0)
    assert list(det.process_step(exits)) == []


def test_a_nan_loss_spread_by_the_all_reduce_names_only_its_source() -> None:
    b = batch(7, {"loss": [2.0, math.nan, 2.1, 2.0], "grad_norm": np.full(4, math.nan)})
    b = StepBatch(
        b.step,
        b.time,
        b.ranks,
        b.nodes,
        b.replicas,
        b.features,
        b.values,
        np.ones(b.values.shape, dtype=bool),
    )  # every NaN here was reported
    (found,) = NonFiniteLoss().process_step(b)
    assert found.subject.rank == 1
    assert {"loss", "grad_norm"} <= set(found.evidence)
    assert found.evidence["ranks_affected"] == 4.0


def test_a_rank_recorded_stopped_is_named_once_it_stayed_so_whatever_the_silence() -> None:
    det = CollectiveHang(k=10.0, min_silence_s=5.0, stopped_k=2.0, stopped_s=0.25)
    for step in range(10):
        for rank in range(3):
            det.process(Frame(Subject(0, rank, "n0"), step, step * 0.1, {"step_time": 0.1}))
    det.process(Frame(Subject(0, 1, "n0"), 9, 1.0, {"proc_stopped": 1.0}))
    det.process(Frame(Subject(0, 0, "n0"), 10, 1.15, {"in_collective": 1.0}))
    assert not det.poll(1.2)  # stopped 0.2 s < 2 median steps (floor 0.25 s)
    (found,) = det.poll(1.3)
    assert (found.subject.rank, found.evidence["stopped"], found.step) == (1, 1.0, 10)
    assert found.evidence["waiting_rank_0"] == 0.0
    everyone = CollectiveHang(stopped_s=0.25)
    for rank in range(2):
        everyone.process(Frame(Subject(0, rank, "n0"), 0, 0.0, {"step_time": 0.1}))
        everyone.process(Frame(Subject(0, rank, "n0"), 0, 0.1, {"proc_stopped": 1.0}))
    # the whole job stopped is suspended: no rank is named for it (a trace's silence rule
    # still speaks of the job)
    assert all("stopped" not in f.evidence for f in everyone.poll(5.0))
