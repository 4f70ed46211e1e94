"""The parts of `eagleeye run` that make any script safe to run: faults from outside the
rank, crash loops, a failed rank's traceback, rank output, the resume contract, stops."""

from __future__ import annotations

import io
import json
import math
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from collector.types import Frame, Sample, Subject
from eagleeye.failures import CrashLoop, RankFailure, rank_error
from eagleeye.injector import FaultFired, OutsideInjector
from eagleeye.rank_output import RankOutput, parse_ranks
from eagleeye.resume import KnownCheckpoints
from eagleeye.stopping import (
    CheckpointRequest,
    pace_known,
    request_checkpoint,
    request_step,
    typical_step_s,
)
from eagleeye.store import RunReader
from ft_runtime.faults import EVENT_INJECTOR_ARMED, FaultSpec, parse_specs


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _until(condition, timeout_s: float = 10.0) -> bool:
    """Waits for ``condition()`` (threads and signals take their time on a busy machine)."""
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return bool(condition())


def _frame(rank: int, step: int, when: float = 0.0) -> Frame:
    return Frame(Subject(rank=rank), step, when, {"step_time": 0.1})


@pytest.fixture
def sleeper():
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield process
    process.kill()
    process.wait()


def _injector(specs: str, pid: int) -> tuple[OutsideInjector, list[FaultFired]]:
    fired: list[FaultFired] = []
    injector = OutsideInjector(parse_specs([specs]), lambda: {1: pid}, fired.append)
    injector.new_attempt(0, started=100.0)
    return injector, fired


def test_a_kill_fires_from_outside_when_the_rank_reports_its_step(sleeper) -> None:
    injector, fired = _injector("kill:rank=1@step=5", sleeper.pid)
    injector.observe([], [_frame(1, 4), _frame(0, 9)])
    assert sleeper.poll() is None
    assert not fired
    injector.observe([], [_frame(1, 5, when=101.0)])
    assert sleeper.wait(5) == -signal.SIGKILL
    (record,) = fired
    assert (str(record.spec), record.step, record.attempt) == ("kill:rank=1@step=5", 5, 0)
    assert injector.unfired() == []


def test_a_loop_that_fires_its_own_faults_is_left_to_do_it(sleeper) -> None:
    injector, fired = _injector("stop:rank=1@step=5", sleeper.pid)
    armed = Sample(EVENT_INJECTOR_ARMED, 0.0, 0.0, {"rank": "1"})
    injector.observe([armed], [_frame(1, 7)])
    assert sleeper.poll() is None
    assert _state(sleeper.pid) != "T"
    assert not fired
    assert [str(s) for s in injector.unfired()] == ["stop:rank=1@step=5"]
    own = Sample("event.fault", 5.0, 0.0, {"rank": "1", "spec": "stop:rank=1@step=5"}, 5)
    injector.observe([own], [])
    assert injector.unfired() == []


def test_a_stop_at_a_time_fires_once_its_attempt_has_run_that_long(sleeper) -> None:
    injector, fired = _injector("stop:rank=1@time=3", sleeper.pid)
    injector.poll(102.9)
    assert _state(sleeper.pid) != "T"
    injector.poll(103.0)
    assert _until(lambda: _state(sleeper.pid) == "T")
    assert [f.step for f in fired] == [None]
    injector.poll(104.0)
    assert len(fired) == 1


def test_a_slow_fault_holds_the_rank_for_its_seconds_at_each_step_it_spans(sleeper) -> None:
    sent: list[tuple[int, int]] = []

    def send(pid: int, sig: int) -> None:
        sent.append((pid, sig))

    injector = OutsideInjector(
        parse_specs(["slow:rank=1@step=3,seconds=0.1,steps=2"]),
        lambda: {1: 42},
        lambda f: None,
        send,
    )
    injector.new_attempt(0, 0.0)
    held = []
    for step in range(1, 8):
        injector.observe([], [_frame(1, step)])
        held.append(injector.held())
        # a held rank reports its next step only once it runs again
        assert _until(lambda: not injector.held())
    assert sent == [(42, signal.SIGSTOP), (42, signal.SIGCONT)] * 2
    assert held == [frozenset()] * 2 + [frozenset({1})] * 2 + [frozenset()] * 3
    assert injector.held() == frozenset()


def test_faults_of_a_later_attempt_wait_for_it(sleeper) -> None:
    injector, fired = _injector("kill:rank=1@step=2,attempt=1", sleeper.pid)
    injector.observe([], [_frame(1, 5)])
    assert sleeper.poll() is None
    injector.new_attempt(1, 200.0)
    injector.observe([], [_frame(1, 2)])
    assert sleeper.wait(5) == -signal.SIGKILL
    assert fired[0].attempt == 1


def _failure(attempt: int, step: int | None = 12, line: str = "ValueError: boom") -> RankFailure:
    return RankFailure(1, attempt, 1, step, f"Traceback (most recent call last):\n{line}", "x")


def test_the_same_failure_in_two_attempts_in_a_row_is_a_crash_loop() -> None:
    loop = CrashLoop()
    assert loop.note(_failure(0)) is None
    reason = loop.note(_failure(1))
    assert reason is not None
    assert "crash loop: rank 1 failed with exit code 1 at step 12" in reason
    assert "ValueError: boom" in reason


def test_ranks_killed_from_outside_twice_at_the_same_step_are_no_crash_loop() -> None:
    loop = CrashLoop()
    for attempt in range(3):
        killed = RankFailure(1, attempt, -signal.SIGKILL, 12, "", "x")
        assert loop.note(killed) is None
    crashed = [RankFailure(0, a, -signal.SIGSEGV, 12, "", "x") for a in (3, 4)]
    assert loop.note(crashed[0]) is None
    assert loop.note(crashed[1]) is not None  # a segfault of its own, twice: a loop


@pytest.mark.parametrize(
    "second", [_failure(1, step=30), _failure(1, line="KeyError: 'x'"), _failure(2)]
)
def test_a_different_failure_or_a_gap_is_no_crash_loop(second) -> None:
    loop = CrashLoop()
    loop.note(_failure(0))
    assert loop.note(second) is None


def test_a_rank_error_comes_from_torchruns_error_file_first(tmp_path) -> None:
    (tmp_path / "rank-1.log").write_text(
        "step 1\nTraceback (most recent call last):\n  File x\nRuntimeError: from the log\n"
    )
    assert rank_error(tmp_path, 1).splitlines()[-1] == "RuntimeError: from the log"
    error = {"message": {"message": "RuntimeError: x", "extraInfo": {"py_callstack": "T\nE"}}}
    (tmp_path / "error-rank-1.json").write_text(json.dumps(error))
    assert rank_error(tmp_path, 1) == "T\nE"
    (tmp_path / "error-rank-1.json").write_text("{not json")
    assert rank_error(tmp_path, 1).endswith("RuntimeError: from the log")
    assert rank_error(tmp_path, 7) == ""


def test_rank_output_is_streamed_with_prefixes_for_the_chosen_ranks(tmp_path) -> None:
    logs = tmp_path / "logs"
    (logs / "attempt-0").mkdir(parents=True)
    out = io.StringIO()
    with RankOutput(logs, ranks={0}, out=out):
        (logs / "attempt-0" / "rank-0.log").write_text("hello\nhalf")
        (logs / "attempt-0" / "rank-1.log").write_text("not shown\n")
        assert _until(lambda: out.getvalue() == "[rank0]: hello\n")
        time.sleep(0.3)  # rank 1's line is not coming: it is filtered out
        assert out.getvalue() == "[rank0]: hello\n"
        (logs / "attempt-1").mkdir()
        (logs / "attempt-1" / "rank-0.log").write_text("again\n")
    # every line once; the partial last line of attempt 0 comes out when streaming stops
    assert sorted(out.getvalue().splitlines()) == [
        "[rank0]: again",
        "[rank0]: half",
        "[rank0]: hello",
    ]
    assert parse_ranks("all") is None
    assert parse_ranks("none") == frozenset()
    with pytest.raises(ValueError, match="not all, none or a comma list"):
        parse_ranks("two")


def _saved(rank: int, step: int, path: str) -> Sample:
    return Sample("event.checkpoint", float(step), 0.0, {"rank": str(rank), "path": path}, step)


def test_the_newest_checkpoint_is_one_every_saving_rank_reported() -> None:
    known = KnownCheckpoints()
    assert known.newest() is None
    known.observe([_saved(0, 10, "/c/10"), _saved(1, 10, "/c/10"), _saved(0, 20, "/c/20")])
    assert known.newest() == "/c/10"  # rank 1 has not reported step 20
    known.observe([_saved(1, 20, "/c/20")])
    assert known.newest() == "/c/20"
    memory = Sample("event.checkpoint", 30.0, 0.0, {"rank": "0", "tier": "memory"}, 30)
    known.observe([memory])
    assert known.newest() == "/c/20"


def test_a_checkpoint_request_reaches_the_ranks_through_the_run_folder(tmp_path) -> None:
    request = CheckpointRequest({"EAGLEEYE_RUN_DIR": str(tmp_path)}, every_s=0.0)
    assert not request.requested()
    request_checkpoint(tmp_path, "SIGTERM")
    assert request.requested()
    assert not CheckpointRequest({}).requested()


def test_a_checkpoint_request_names_the_step_every_rank_leaves_at(tmp_path) -> None:
    env = {"EAGLEEYE_RUN_DIR": str(tmp_path)}
    early, late = CheckpointRequest(env, every_s=0.0), CheckpointRequest(env, every_s=0.0)
    request_checkpoint(tmp_path, "SIGTERM", at_step=40)
    assert not early.requested(38)
    assert not late.requested(39)
    assert early.requested(40)
    assert late.requested(40)
    assert early.requested(None)  # a loop without step numbers is asked at once


def test_an_unreadable_checkpoint_request_asks_at_once(tmp_path) -> None:
    (tmp_path / "control").mkdir()
    (tmp_path / "control" / "checkpoint-request").write_text("1764000000.0 SIGTERM\n")
    assert CheckpointRequest({"EAGLEEYE_RUN_DIR": str(tmp_path)}).requested(3)


def test_the_step_asked_for_is_a_second_and_a_half_of_training_ahead() -> None:
    assert request_step(None, 0.01) is None
    assert request_step(100, 0.01) == 250
    assert request_step(100, 5.0) == 103  # slow steps: still a few steps of margin
    assert request_step(100, None) == 103
    assert request_step(100, math.nan) == 103


def test_the_lead_is_counted_in_the_fast_steps_not_the_warm_up() -> None:
    warm_up, steady = [2.0, 1.5, 0.9], [0.01] * 3  # a median would take 0.9 s a step
    assert typical_step_s([*warm_up, *steady]) == 0.01
    assert request_step(100, typical_step_s([*warm_up, *steady])) == 250
    assert typical_step_s([math.nan, -1.0, 0.0]) is None  # nothing usable: a few steps
    assert typical_step_s([]) is None


def test_an_early_stop_names_a_step_only_once_a_few_step_times_are_known() -> None:
    """Seen under load: a stop before any step named 105 on the first step's 14 ms alone;
    the ranks ran 0.5 ms steps and were past it when the request reached them."""
    first = [0.0143]
    assert not pace_known(first)
    assert request_step(0, typical_step_s(first)) == 105  # about 50 ms of real training
    steps = [0.0143, 0.0044, 0.0012, 0.0005, 0.0004, 0.0040, 0.0005, 0.0005]
    assert not pace_known([*steps[:-1], math.nan])  # a step time that says nothing
    assert pace_known(steps)
    assert request_step(0, typical_step_s(steps)) == 3000  # 1.5 s of those steps


def test_time_faults_are_only_the_ones_fired_from_outside() -> None:
    assert str(FaultSpec.parse("stop:rank=1@time=2.5")) == "stop:rank=1@time=2.5"
    assert not FaultSpec.parse("kill:rank=1@time=2").active(0)
    for bad in ("nan:rank=0@time=3", "kill:rank=0@time=3,phase=backward"):
        with pytest.raises(Exception, match="cannot fire at a time"):
            FaultSpec.parse(bad)
    with pytest.raises(Exception, match="needs one of step= or time="):
        FaultSpec.parse("kill:rank=0@step=1,time=3")


CRASHING = """
from torch.distributed.elastic.multiprocessing.errors import record


@record
def main():
    print("loading the config", flush=True)
    raise ValueError("learning_rate must be positive, got -1")


main()
"""


@pytest.mark.timeout(120)
def test_a_crash_at_every_start_stops_after_two_attempts_with_its_traceback(tmp_path) -> None:
    (tmp_path / "train.py").write_text(CRASHING)
    command = [sys.executable, "-m", "eagleeye", "run", "--nproc-per-node", "2", "--remediate"]
    command += ["--stream", "none", "--no-instrument", "train.py"]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=100)
    assert result.returncode == 1
    err = " ".join(result.stderr.split())
    assert "crash loop: rank" in err
    assert "before its first step in attempts 0 and 1" in err
    # the traceback, from torchrun's error file that @record wrote
    assert "ValueError: learning_rate must be positive, got -1" in err
    assert "in main" in err
    # the closing lines: every finding with the host it was on
    host = socket.gethostname()
    assert "finding(s), each on its host:" in err
    assert re.search(rf"process_exit on rank \d, host {re.escape(host)} \(critical\)", err)
    (run,) = (tmp_path / "runs").iterdir()
    with RunReader(run) as reader:
        assert reader.meta()["hosts"] == {"node0": host}
        assert reader.meta()["result"]["attempts"] == 2
        failed = reader.events().query("subject == 'job' and phase == 'failed'")
    assert "crash loop" in failed["detail"].iloc[0]["reason"]
    assert (run / "logs" / "attempt-1" / "error-rank-0.json").is_file()
