"""ElasticWorkers: the workers of torchrun's agent, watched from the agent's process.

The workers here are real child processes of the test, started with a worker's
environment as torchrun's agent starts them; the test plays the agent (it reaps them).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from ft_runtime.elastic import ElasticWorkers
from ft_runtime.types import Action, ActionKind, LifecycleEvent, OutcomeStatus, Phase

RUN = "job-7"


def _worker(rank: int, code: str, run_id: str = RUN, restarts: int = 0) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "TORCHELASTIC_RUN_ID": run_id,
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "TORCHELASTIC_RESTART_COUNT": str(restarts),
    }
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdin=subprocess.PIPE)


# A worker that ends when the test closes its stdin: it is alive until seen launched.
UNTIL_RELEASED = "import sys; sys.stdin.read(); sys.exit({code})"


def _events_until(
    workers: ElasticWorkers, done: object, timeout_s: float = 20.0
) -> list[LifecycleEvent]:
    seen: list[LifecycleEvent] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        seen += workers.poll()
        if done(seen):  # type: ignore[operator]
            return seen
        time.sleep(0.02)
    raise AssertionError(f"not seen in {timeout_s} s: {seen}")


def _exits(events: list[LifecycleEvent]) -> dict[str, LifecycleEvent]:
    return {e.subject: e for e in events if e.phase is Phase.EXITED}


def test_each_worker_is_launched_and_its_exit_status_read_without_reaping_it() -> None:
    workers = ElasticWorkers(RUN)
    workers.begin_round("node1")
    procs = [
        _worker(0, UNTIL_RELEASED.format(code=0)),
        _worker(1, UNTIL_RELEASED.format(code=3)),
        _worker(2, "import time; time.sleep(60)", restarts=2),
    ]
    other = _worker(5, "import time; time.sleep(0.5)", run_id="another-job")
    launched = _events_until(
        workers, lambda seen: sum(e.phase is Phase.LAUNCH and "pid" in e.detail for e in seen) == 3
    )
    by_rank = {e.subject: e for e in launched if e.phase is Phase.LAUNCH and "pid" in e.detail}
    assert set(by_rank) == {"rank:0", "rank:1", "rank:2"}  # not the other job's child
    assert by_rank["rank:2"].detail["pid"] == procs[2].pid
    assert by_rank["rank:2"].detail["attempt"] == 2  # what its telemetry is labelled with
    assert by_rank["rank:0"].detail["node"] == "node1"
    for proc in procs[:2]:
        assert proc.stdin is not None
        proc.stdin.close()  # both end now
    events = _events_until(workers, lambda seen: len(_exits(seen)) == 2)
    procs[2].send_signal(signal.SIGKILL)  # after rank 1's failure
    exits = _exits(events + _events_until(workers, lambda seen: bool(_exits(seen))))
    assert exits["rank:0"].detail["exit_code"] == 0
    assert exits["rank:1"].detail["exit_code"] == 3
    assert exits["rank:2"].detail["exit_code"] == -signal.SIGKILL
    assert exits["rank:1"].detail["collateral"] is False
    assert exits["rank:2"].detail["collateral"] is True  # within the window of the first
    # the agent (here the test) still reaps its children and reads the same statuses
    assert [p.wait(timeout=5) for p in procs] == [0, 3, -signal.SIGKILL]
    other.wait(timeout=5)
    assert workers.alive() == 0
    assert workers.pids() == {}


def test_a_restart_is_a_new_round_asked_of_the_agents_and_a_stopped_worker_is_continued() -> None:
    workers = ElasticWorkers(RUN)
    env = workers.begin_round("node0")
    assert env == {}
    proc = _worker(0, "import time; time.sleep(60)")
    try:
        _events_until(workers, lambda seen: any(e.subject == "rank:0" for e in seen))
        proc.send_signal(signal.SIGSTOP)
        outcome = workers.execute(Action(ActionKind.RESTART, "job", "hang on rank 0", "r/1"))
        assert outcome.status is OutcomeStatus.DONE
        assert "new rendezvous round" in outcome.detail
        assert workers.restart_requested
        assert workers.phase is Phase.RECOVERING
        again = workers.execute(Action(ActionKind.RESTART, "job", "hang on rank 0", "r/1"))
        assert again.status is OutcomeStatus.SKIPPED  # the same action, once
        other = workers.execute(Action(ActionKind.RESTART, "job", "hang, seen again", "r/9"))
        assert other.status is OutcomeStatus.SKIPPED
        assert "already asked" in other.detail
        proc.send_signal(signal.SIGTERM)  # as the agent stops its workers
        assert proc.wait(timeout=10) == -signal.SIGTERM  # it was continued, so it ended
        exits = _exits(_events_until(workers, lambda seen: bool(_exits(seen))))
        assert exits["rank:0"].detail["collateral"] is True  # a stop asked for, no failure
        workers.poll()
        workers.begin_round("node0")
        job = [(e.phase, e.detail.get("reason")) for e in workers.poll() if e.subject == "job"]
        assert job == [(Phase.RECOVERING, "hang on rank 0"), (Phase.LAUNCH, None)]
        assert not workers.restart_requested
        assert workers.attempt == 1
        assert workers.phase is Phase.RUNNING
    finally:
        proc.kill()
        proc.wait()


def test_after_a_failure_the_agent_restarts_by_itself_and_other_actions_are_refused() -> None:
    workers = ElasticWorkers(RUN)
    workers.begin_round("node0")
    proc = _worker(0, "import sys; sys.exit(1)")
    _events_until(workers, lambda seen: bool(_exits(seen)))
    proc.wait()
    outcome = workers.execute(Action(ActionKind.RESTART, "job", "rank 0 exited 1", "r/2"))
    assert outcome.status is OutcomeStatus.DONE
    assert "itself" in outcome.detail
    assert not workers.restart_requested  # torchrun's own restart, not a new round
    isolate = workers.execute(Action(ActionKind.ISOLATE, "replica:0", "slow", "i/1"))
    assert isolate.status is OutcomeStatus.SKIPPED
    assert "torchrun" in isolate.detail
    workers.stop_restarting("a crash loop")
    workers.begin_round("node0")
    refused = workers.execute(Action(ActionKind.RESTART, "job", "again", "r/3"))
    assert refused.status is OutcomeStatus.SKIPPED
    assert refused.detail == "a crash loop"


@pytest.mark.parametrize(("codes", "phase"), [((0, 0), Phase.SUCCEEDED), ((0, 2), Phase.FAILED)])
def test_the_result_is_the_last_rounds_exits(codes: tuple[int, int], phase: Phase) -> None:
    workers = ElasticWorkers(RUN)
    workers.begin_round("node0")
    procs = [_worker(rank, f"import sys; sys.exit({code})") for rank, code in enumerate(codes)]
    _events_until(workers, lambda seen: len(_exits(seen)) == 2)
    for proc in procs:
        proc.wait()
    workers.end()
    assert workers.finished
    assert workers.phase is phase
    ended = [e for e in workers.poll() if e.subject == "job"]
    assert [e.phase for e in ended] == [phase]
    if phase is Phase.FAILED:
        assert "[1]" in str(ended[0].detail["reason"])


def test_an_agent_that_started_no_worker_failed() -> None:
    workers = ElasticWorkers(RUN)
    workers.begin_round("node0")
    workers.end()
    assert workers.phase is Phase.FAILED
    reasons = [e.detail.get("reason") for e in workers.poll() if e.subject == "job"]
    assert "no worker started" in str(reasons[-1])
