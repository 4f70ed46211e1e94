"""The controller side of replica recovery with a fake launcher and a real quorum store:
commands never block (pending, then final from a later poll), a replica that never answers
fails the command at its deadline, stalls come as reports, replica state is one record."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from ft_runtime.layout import JobLayout
from ft_runtime.quorum import QuorumService, StallReport
from ft_runtime.replica import ReplicaState, ReplicaSupervisor
from ft_runtime.replica.protocol import (
    Answer,
    Failed,
    Heartbeat,
    Refused,
    Restored,
    Saved,
    Skipped,
    encode,
    key_answer,
    key_heartbeat,
)
from ft_runtime.supervisor import LaunchSpec
from ft_runtime.testing import FakeLauncher
from ft_runtime.types import Action, ActionKind, OutcomeStatus, Phase
from tests.conftest import VirtualClock


class Timer:
    """Monotonic seconds that move only when told."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make(
    tmp_path: Path, clock: VirtualClock, replicas: int = 2, **kwargs: object
) -> tuple[ReplicaSupervisor, FakeLauncher, Timer]:
    launch = LaunchSpec(["train.py"], JobLayout(replicas, 1, replicas), "t", str(tmp_path))
    quorum = QuorumService(replicas, 1, clock=clock, stall_floor_s=0.1)
    launcher, timer = FakeLauncher(clock), Timer()
    sup = ReplicaSupervisor(
        launch,
        quorum,
        clock=clock,
        launcher=launcher,
        timer=timer,
        command_timeout_s=30.0,
        **kwargs,  # type: ignore[arg-type]
    )
    sup.start()
    return sup, launcher, timer


@pytest.fixture
def made(tmp_path, clock):
    sup, launcher, timer = make(tmp_path, clock)
    yield sup, launcher, timer
    sup.stop_all()


def answer(sup: ReplicaSupervisor, number: int, replica: int, body: Answer) -> None:
    """What rank 0 of ``replica`` writes (on the service's own connection: in order)."""
    assert sup.quorum.store is not None
    sup.quorum.store.set(key_answer(number, replica), encode(body))


def checkpoint(key: str = "c1") -> Action:
    return Action(ActionKind.CHECKPOINT, "job", "before a risky stretch", key)


def test_the_launcher_starts_each_rank_with_its_quorum_and_incarnation(made) -> None:
    sup, launcher, _ = made
    assert [(rank, gen) for rank, gen, _ in launcher.started] == [(0, 0), (1, 0)]
    env = launcher.started[1][2]
    assert env["EAGLEEYE_QUORUM"] == sup.quorum.address
    assert "PATH" not in env  # only the rank's own variables: the host adds its own
    assert sup.replicas == {
        0: ReplicaState(0, 0, Phase.RUNNING),
        1: ReplicaState(0, 0, Phase.RUNNING),
    }


def test_a_command_is_pending_until_every_replica_answered(made) -> None:
    sup, _, _ = made
    sent = sup.execute(checkpoint())
    assert sent.status is OutcomeStatus.PENDING
    assert sent.data["command"] == 1
    assert sent.data["replicas"] == [0, 1]
    sup.poll()
    assert sup.outcomes() == []  # nobody answered: the poll returned without waiting
    answer(sup, 1, 0, Saved(40, "/ckpt/40"))
    sup.poll()
    assert sup.outcomes() == []
    assert sup.pending() == 1
    answer(sup, 1, 1, Refused("not the epoch's source: it saves"))
    events = sup.poll()
    (done,) = sup.outcomes()
    assert done.status is OutcomeStatus.DONE
    assert done.action == sent.action
    assert done.detail == "replica 0 saved step 40 to /ckpt/40"
    assert (done.data["step"], done.data["path"]) == (40, "/ckpt/40")
    assert done.data["answers"] == {
        "0": {"kind": "saved", "step": 40, "path": "/ckpt/40"},
        "1": {"kind": "refused", "reason": "not the epoch's source: it saves"},
    }
    recorded = [e for e in events if e.subject == "command:1"]
    assert recorded[0].phase is Phase.SUCCEEDED
    assert recorded[0].detail["key"] == "c1"
    assert sup.pending() == 0


def test_a_replica_that_never_answers_fails_the_command_after_the_deadline(made) -> None:
    sup, _, timer = made
    sup.execute(Action(ActionKind.ROLLBACK, "step:30", "bad stretch", "r1"))
    answer(sup, 1, 0, Restored(20, 35, 1.0))
    timer.now = 29.9
    sup.poll()
    assert sup.outcomes() == []
    timer.now = 30.0
    sup.poll()
    (failed,) = sup.outcomes()
    assert failed.status is OutcomeStatus.FAILED
    assert failed.detail == "rollback #1: no answer from replicas [1] within 30 s"
    assert failed.data["missing"] == [1]
    restored = {"kind": "restored", "step": 20, "from_step": 35, "lr_factor": 1.0}
    assert failed.data["answers"] == {"0": restored}


def test_a_replica_dropped_while_a_command_is_in_flight_owes_no_answer(made) -> None:
    sup, launcher, _ = made
    sup.execute(Action(ActionKind.SKIP_BATCH, "job", "loss spike", "s1"))
    launcher.exit(1, 3)  # replica 1's rank dies: the quorum drops it
    sup.poll()
    answer(sup, 1, 0, Skipped(17))
    sup.poll()
    (done,) = sup.outcomes()
    assert done.status is OutcomeStatus.DONE, done.detail
    assert done.detail == "skipped batches {0: 17}"
    assert done.data["left"] == [1]


def test_an_error_or_a_malformed_answer_fails_the_command(made) -> None:
    sup, _, _ = made
    sup.execute(Action(ActionKind.ROLLBACK, "job", "spike", "r1"))
    answer(sup, 1, 0, Failed("no checkpoint at or before 2"))
    assert sup.quorum.store is not None
    sup.quorum.store.set(key_answer(1, 1), "not json")
    sup.poll()
    (failed,) = sup.outcomes()
    assert failed.status is OutcomeStatus.FAILED
    assert "no checkpoint at or before 2" in failed.detail
    assert failed.data["answers"]["1"]["error"].startswith("unreadable answer:")


def beat(sup: ReplicaSupervisor, step: int, ranks: range | tuple[int, ...]) -> None:
    """What a rank writes as it enters the exchange of ``step`` (its seq: one per step)."""
    assert sup.quorum.store is not None
    for rank in ranks:
        sup.quorum.store.set(key_heartbeat(rank), encode(Heartbeat(step + 1, step)))


def steady(sup: ReplicaSupervisor, clock: VirtualClock, steps: int = 5) -> None:
    for step in range(steps):
        beat(sup, step, range(2))
        sup.poll()
        clock.advance(0.1)


def test_a_stall_is_a_report_and_a_stopped_rank_is_fenced_with_it(made, clock) -> None:
    sup, launcher, _ = made
    steady(sup, clock)
    beat(sup, 5, (0,))  # replica 0 waits at step 5; rank 1 stopped before it
    sup.poll()
    launcher.freeze(1)
    clock.advance(0.08)
    assert sup.quorum.stalled() == StallReport((), (1,), pytest.approx(0.08), pytest.approx(0.1))
    clock.advance(0.04)
    report = sup.quorum.stalled()
    assert report == StallReport((1,), (1,), pytest.approx(0.12), pytest.approx(0.1))
    events = sup.poll()
    (fenced,) = [e for e in events if e.subject == "replica:1" and e.phase is Phase.EXITED]
    assert fenced.detail["reason"].startswith("hung")
    evidence = fenced.detail["evidence"]
    assert evidence["late_ranks"] == [1]
    assert evidence["waited_s"] >= evidence["limit_s"] == pytest.approx(0.1)
    assert (1, signal.SIGKILL) in launcher.signals
    assert sup.replicas[1].dropped_at == clock()
    assert sup.quorum.current.members == (0,)


def test_a_stopped_late_rank_is_fenced_at_the_first_look_before_any_limit(made, clock) -> None:
    sup, launcher, _ = made
    steady(sup, clock)
    launcher.freeze(1)  # SIGSTOPped while it computes step 5
    beat(sup, 5, (0,))  # replica 0 enters the exchange of step 5 and waits
    events = sup.poll()
    (fenced,) = [e for e in events if e.subject == "replica:1" and e.phase is Phase.EXITED]
    assert fenced.detail["reason"].startswith("hung: stopped")
    evidence = fenced.detail["evidence"]
    assert evidence["stopped_ranks"] == evidence["late_ranks"] == [1]
    assert evidence["waited_s"] < evidence["limit_s"] == pytest.approx(0.1)
    assert sup.quorum.current.members == (0,)


def test_healthy_lateness_and_a_stopped_rank_nobody_waits_for_are_left_alone(made, clock) -> None:
    sup, launcher, _ = made
    steady(sup, clock)
    beat(sup, 5, (0,))  # rank 1 late, but running: the limit decides, not the look
    sup.poll()
    clock.advance(0.05)
    sup.poll()
    beat(sup, 5, (1,))
    sup.poll()
    launcher.freeze(1)  # stopped between exchanges: nobody waits for it yet
    clock.advance(0.02)
    sup.poll()
    assert sup.quorum.current.members == (0, 1)
    assert (1, signal.SIGKILL) not in launcher.signals


def test_a_rank_stopped_inside_the_exchange_is_fenced_after_one_limit(made, clock) -> None:
    sup, launcher, _ = made
    steady(sup, clock)
    beat(sup, 5, range(2))  # both entered step 5's exchange; rank 1 stops inside it
    launcher.freeze(1)
    sup.poll()
    clock.advance(0.08)
    sup.poll()
    assert sup.quorum.current.members == (0, 1)  # nobody late: the limit first
    clock.advance(0.04)
    events = sup.poll()
    (fenced,) = [e for e in events if e.subject == "replica:1" and e.phase is Phase.EXITED]
    assert fenced.detail["evidence"]["stopped_ranks"] == [1]
    assert sup.quorum.current.members == (0,)


def test_a_rank_a_slow_fault_holds_is_judged_by_the_limit_not_its_state(made, clock) -> None:
    sup, launcher, _ = made
    sup.held = lambda: {1}  # the injector's duty cycle holds it stopped right now
    steady(sup, clock)
    launcher.freeze(1)
    beat(sup, 5, (0,))
    sup.poll()
    clock.advance(0.08)
    sup.poll()
    assert sup.quorum.current.members == (0, 1)
    clock.advance(0.04)  # past the limit and not running: hung, as before
    events = sup.poll()
    (fenced,) = [e for e in events if e.subject == "replica:1" and e.phase is Phase.EXITED]
    assert fenced.detail["reason"] == "hung: never entered the exchange the others wait in"
    assert fenced.detail["evidence"]["stopped_ranks"] == []


def test_a_job_suspended_as_a_whole_is_no_hang(made, clock) -> None:
    sup, launcher, _ = made
    steady(sup, clock)
    beat(sup, 5, (0,))
    launcher.freeze(0)  # a scheduler stops every rank, rank 1 before its exchange
    launcher.freeze(1)
    for _ in range(4):  # well past the limit: still nobody waits for anybody
        sup.poll()
        clock.advance(0.1)
    assert sup.quorum.current.members == (0, 1)
    assert launcher.signals == []


def test_a_rank_resumed_before_the_second_look_is_no_hang(made, clock) -> None:
    sup, launcher, _ = made
    steady(sup, clock)
    launcher.freeze(1)
    beat(sup, 5, (0,))
    sup.sleep = lambda seconds: launcher.thaw(1)  # SIGCONT comes between the two looks
    sup.poll()
    assert sup.quorum.current.members == (0, 1)
    assert launcher.signals == []


def test_a_late_rank_that_runs_is_a_straggler_until_five_limits(made, clock) -> None:
    sup, launcher, _ = made
    steady(sup, clock)
    beat(sup, 5, (0,))
    sup.poll()
    for _ in range(3):  # 0.45 s: late, but it gets CPU time
        clock.advance(0.15)
        sup.poll()
    assert sup.quorum.current.members == (0, 1)
    clock.advance(0.1)  # 0.55 s, past 5 limits: hung even though it runs
    sup.poll()
    assert sup.quorum.current.members == (0,)


def test_a_restart_relaunches_one_replica_as_its_next_incarnation(made) -> None:
    sup, launcher, _ = made
    launcher.exit(1, 3)
    sup.poll()
    outcome = sup.execute(Action(ActionKind.RESTART, "replica:1", "exited", "k1"))
    assert outcome.status is OutcomeStatus.DONE
    assert outcome.data == {"replica": 1, "incarnation": 1, "source": 0}
    assert sup.replicas[1] == ReplicaState(1, 1, Phase.PRE_CHECK)
    assert launcher.started[-1][:2] == (1, 1)
    assert 1 in launcher.stopped  # the old process was ended first


def test_a_source_lost_while_its_peer_catches_up_restarts_the_job(made) -> None:
    sup, launcher, _ = made
    launcher.exit(1, 3)
    sup.poll()
    sup.execute(Action(ActionKind.RESTART, "replica:1", "exited", "k1"))
    assert sup.quorum.healthy == (0,)  # replica 1 catches up from replica 0
    launcher.exit(0, -9)  # the source dies while it serves
    sup.poll()
    outcome = sup.execute(Action(ActionKind.RESTART, "replica:0", "exited", "k2"))
    assert outcome.status is OutcomeStatus.DONE
    assert outcome.data == {"replica": 0, "attempt": 1}  # no catch-up from nobody
    assert sup.attempt == 1
    assert sup.quorum.healthy == (0, 1)  # every replica a member again, from the checkpoint
    assert [(rank, gen) for rank, gen, _ in launcher.started][-2:] == [(0, 1), (1, 2)]


def test_the_job_supervisor_runs_on_the_same_launcher(tmp_path, clock) -> None:
    from ft_runtime.supervisor import JobSupervisor

    launcher = FakeLauncher(clock)
    launch = LaunchSpec(["train.py"], JobLayout(2, 1, 2), "t", str(tmp_path))
    sup = JobSupervisor(launch, max_restarts=1, clock=clock, launcher=launcher)
    sup.start()
    launcher.exit(1, 3)
    events = sup.poll()
    assert [(e.subject, e.detail["exit_code"]) for e in events if e.phase is Phase.EXITED] == [
        ("rank:1", 3)
    ]
    outcome = sup.execute(Action(ActionKind.RESTART, "job", "rank 1 exited", "k"))
    assert outcome.status is OutcomeStatus.DONE
    assert sorted(launcher.stopped) == [0, 1]  # every rank of attempt 0 was stopped first
    assert [(rank, gen) for rank, gen, _ in launcher.started] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    assert sup.outcomes() == []  # nothing is ever pending here


def test_both_supervisors_stop_on_request_alike(tmp_path, clock) -> None:
    from ft_runtime.supervisor import JobSupervisor

    replicas, replica_launcher, _ = make(tmp_path / "r", clock)
    launcher = FakeLauncher(clock)
    job = JobSupervisor(
        LaunchSpec(["t.py"], JobLayout(2, 1, 2), "t", str(tmp_path)), launcher=launcher
    )
    job.start()
    job.poll()
    replicas.poll()
    for sup, fake in ((job, launcher), (replicas, replica_launcher)):
        sup.stop("asked to stop", grace_s=5.0)
        sup.stop("asked again")  # already failed: recorded once
        assert sorted(set(fake.stopped)) == [0, 1]
        assert sup.phase is Phase.FAILED
        events = sup.poll()
        failed = [e.detail for e in events if e.subject == "job" and e.phase is Phase.FAILED]
        assert failed == [{"reason": "asked to stop", "stopped": True}]
        assert not [e for e in events if e.phase is Phase.EXITED]  # no stopped rank "failed"


def test_the_controller_side_imports_nothing_private() -> None:
    import ast

    for name in ("supervisor", "inflight", "state", "config"):
        path = Path(__file__).parents[2] / "ft_runtime" / "replica" / f"{name}.py"
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module != "__future__":
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert not private, f"{path.name} imports {private} from {node.module}"
                assert not any(p.startswith("_") for p in (node.module or "").split("."))
