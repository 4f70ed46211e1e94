from __future__ import annotations

import threading
import time

from collector.hooks import TrainingHook


def rows_by_name(batches):
    return {row[0]: row for batch in batches for row in batch}


def test_a_step_produces_timings_metrics_and_collectives() -> None:
    batches = []
    hook = TrainingHook(lambda labels, rows: batches.append(rows) or True, {"rank": "1"})
    hook.step_start(5)
    with hook.section("forward"):
        time.sleep(0.01)
    with hook.collective("all_reduce", nbytes=1024):
        pass
    with hook.collective("all_reduce", nbytes=1024):
        pass
    hook.step_end(5, loss=1.5, lr=0.1)
    hook.close()
    rows = [row for batch in batches for row in batch]
    named = rows_by_name(batches)
    assert named["section.forward"][1] >= 0.01
    assert named["step_time"][1] >= named["section.forward"][1]
    assert named["loss"][1] == 1.5
    assert named["loss"][3] == 5
    seqs = [row[4]["seq"] for row in rows if row[0] == "collective"]
    assert seqs == ["0", "1"]  # a per-group sequence number, as NCCL's flight recorder has


def test_a_failing_transport_never_raises_into_the_loop() -> None:
    def broken(labels, rows):
        raise ConnectionError("controller gone")

    hook = TrainingHook(broken, {"rank": "0"})
    for step in range(5):
        hook.step_start(step)
        hook.step_end(step, loss=1.0)
    assert hook.flush(2.0)
    assert hook.dropped == 10  # 2 rows per step, all counted as dropped
    hook.close()


def test_a_full_queue_drops_and_counts_instead_of_blocking() -> None:
    release = threading.Event()

    def stuck(labels, rows):
        release.wait(5)
        return True

    hook = TrainingHook(stuck, {"rank": "0"}, queue_size=2)
    started = time.perf_counter()
    for step in range(50):
        hook.step_start(step)
        hook.step_end(step)
    elapsed = time.perf_counter() - started
    assert hook.dropped >= 40  # the sender holds one batch and the queue two
    assert elapsed < 1.0, "step_end must not wait for the transport"
    release.set()
    hook.close()


def test_metrics_that_are_not_numbers_become_nan_not_errors() -> None:
    batches = []
    hook = TrainingHook(lambda labels, rows: batches.append(rows) or True, {})
    hook.step_start(0)
    hook.step_end(0, loss="not a number")  # type: ignore[arg-type]
    hook.close()
    assert str(rows_by_name(batches)["loss"][1]) == "nan"


def test_a_collective_that_stays_open_is_reported_while_it_waits_and_when_it_ends() -> None:
    sent = []
    hook = TrainingHook(lambda labels, rows: sent.extend(rows) or True, {}, wait_report_s=0.1)
    hook.step_start(3)
    with hook.collective("all_reduce", nbytes=8, group="world"):
        deadline = time.monotonic() + 5
        while not any(row[0] == "in_collective" for row in sent) and time.monotonic() < deadline:
            time.sleep(0.01)
        waits = [row for row in sent if row[0] == "in_collective"]
    hook.step_end(3)
    hook.close()
    (report,) = waits  # sent once, while the collective was still open
    assert report[1] >= 0.1
    assert report[3] == 3
    assert report[4] == {"op": "all_reduce", "group": "world", "seq": "0"}
    ends = [row for row in sent if row[0] == "in_collective" and row[1] == 0.0]
    assert len(ends) == 1
    assert [row[4]["seq"] for row in sent if row[0] == "collective"] == ["0"]


def test_a_short_collective_sends_no_wait_report() -> None:
    sent = []
    hook = TrainingHook(lambda labels, rows: sent.extend(rows) or True, {}, wait_report_s=0.5)
    hook.step_start(0)
    with hook.collective("barrier"):
        pass
    hook.step_end(0)
    hook.close()
    assert not [row for row in sent if row[0] == "in_collective"]


def test_a_declared_pause_is_sent_at_once_and_pauses_nest() -> None:
    sent = []
    hook = TrainingHook(lambda labels, rows: sent.extend(rows) or True, {})
    hook.step_start(4)
    with hook.pause("eval"):
        with hook.pause("checkpoint"):
            hook.flush()
            assert [(r[0], r[1], r[4]) for r in sent] == [("pause", 1.0, {"pause": "eval"})]
        hook.end_pause("never begun")  # does nothing
    hook.flush()
    assert [(r[0], r[1], r[3]) for r in sent][-1] == ("pause", 0.0, 4)
    hook.close()


def test_steps_the_loop_reports_replace_the_automatic_ones() -> None:
    sent = []
    hook = TrainingHook(lambda labels, rows: sent.extend(rows) or True, {})
    hook.auto_step_start(0)
    hook.auto_step_end(0, loss=2.0)  # a script that reports nothing: the automatic step
    hook.step_start(10)
    hook.auto_step_end(1, loss=3.0)  # ignored from the loop's first own step on
    hook.auto_step_start(2)
    hook.step_end(10, loss=1.0)
    hook.close()
    assert [(r[0], r[3]) for r in sent if r[0] in ("step_time", "loss")] == [
        ("step_time", 0),
        ("loss", 0),
        ("step_time", 10),
        ("loss", 10),
    ]


def test_overlapping_collectives_count_once_in_the_steps_collective_time() -> None:
    sent = []
    hook = TrainingHook(lambda labels, rows: sent.extend(rows) or True, {})
    hook.step_start(0)
    first = hook.collective_enter("all_reduce")
    second = hook.collective_enter("all_reduce")  # asynchronous: both open at once
    time.sleep(0.05)
    hook.collective_exit(first)
    hook.collective_exit(second)
    with hook.collective("barrier"):
        assert hook.timing_explicitly  # the zero-code wrappers stand aside in here
    hook.step_end(0)
    hook.close()
    named = {r[0]: r[1] for r in sent}
    spent = sum(r[1] for r in sent if r[0] == "collective")
    assert 0.05 <= named["collective_time"] < spent
    assert not hook.timing_explicitly
