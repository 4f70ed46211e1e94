"""The replica supervisor with real processes: a failure costs one replica, restarts are
per replica and budgeted, the last healthy replica is never restarted, nodes are evicted."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from ft_runtime.launcher import LocalLauncher
from ft_runtime.layout import JobLayout
from ft_runtime.quorum import QuorumService
from ft_runtime.replica import ReplicaSupervisor
from ft_runtime.supervisor import LaunchSpec
from ft_runtime.types import Action, ActionKind, OutcomeStatus, Phase

pytestmark = pytest.mark.integration

# Rank 1 of incarnation 0 fails early; rank 0 trains on for 3 s; a restarted rank is quick.
SCRIPT = """
import os, sys, time
rank, inc = os.environ["RANK"], os.environ["TORCHELASTIC_RESTART_COUNT"]
assert os.environ["EAGLEEYE_QUORUM"]
time.sleep(3.0 if rank == "0" else 0.3)
sys.exit(3 if (rank, inc) == ("1", "0") else 0)
"""


def supervisor(
    tmp_path: Path, restarts: int = 1, script_text: str = SCRIPT, launcher=None
) -> ReplicaSupervisor:
    script = tmp_path / "rank.py"
    script.write_text(script_text)
    layout = JobLayout(2, 1, 2)
    spec = LaunchSpec([str(script)], layout, "test", str(tmp_path / "logs"), stop_grace_s=1.0)
    return ReplicaSupervisor(spec, QuorumService(2, 1), max_restarts=restarts, launcher=launcher)


def poll_until(sup: ReplicaSupervisor, done, timeout_s: float = 20.0) -> list:
    events: list = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        events += sup.poll() + sup.settle()
        if done(events):
            return events
        time.sleep(0.05)
    raise AssertionError(f"timed out; events so far: {events}")


def test_a_failed_rank_costs_its_replica_which_restarts_alone(tmp_path) -> None:
    sup = supervisor(tmp_path)
    sup.start()
    try:
        events = poll_until(
            sup, lambda ev: any(e.phase is Phase.EXITED for e in ev if e.subject == "replica:1")
        )
        assert sup.quorum.current.members == (0,)
        assert sup.phase is Phase.RUNNING  # the job goes on with replica 0
        only_healthy = Action(ActionKind.RESTART, "replica:0", "test", "k0")
        assert sup.execute(only_healthy).status is OutcomeStatus.SKIPPED
        restart = sup.execute(Action(ActionKind.RESTART, "rank:1", "test", "k1"))
        assert restart.status is OutcomeStatus.DONE
        assert sup.incarnation == {0: 0, 1: 1}
        assert sup.execute(Action(ActionKind.RESTART, "rank:1", "test", "k1")).status is (
            OutcomeStatus.SKIPPED
        )
        events += poll_until(sup, lambda ev: sup.finished)
        assert sup.phase is Phase.SUCCEEDED
        phases = [e.phase for e in events if e.subject == "replica:1"]
        failed = phases.index(Phase.EXITED)
        assert phases[failed : failed + 3] == [Phase.EXITED, Phase.RECOVERING, Phase.LAUNCH]
        budget = sup.execute(Action(ActionKind.RESTART, "replica:1", "test", "k2"))
        assert budget.status is OutcomeStatus.SKIPPED  # the job is over
    finally:
        sup.stop_all()


def test_evicting_a_node_moves_its_replica_to_a_spare(tmp_path) -> None:
    sup = supervisor(tmp_path, restarts=2)
    sup.start()
    try:
        outcome = sup.execute(Action(ActionKind.EVICT, "node:node1", "xid 79", "e1"))
        assert outcome.status is OutcomeStatus.DONE
        assert "node1" in sup.evicted_nodes
        assert sup.pids()  # ranks are running
        events = sup.poll()
        evicted = [e for e in events if e.subject == "node:node1"]
        assert evicted[0].phase is Phase.EVICTED
        launches = [e for e in events if e.subject == "rank:1" and e.phase is Phase.LAUNCH]
        assert launches[-1].detail["node"] == "spare1"
    finally:
        sup.stop_all()


class _LateExits(LocalLauncher):
    """Queues each exit well after the process was reaped, as a loaded host may."""

    def _wait(self, rank, generation, process) -> None:
        process.wait()
        time.sleep(0.5)
        super()._wait(rank, generation, process)


def test_an_exit_reaped_but_not_yet_queued_does_not_end_the_job(tmp_path) -> None:
    sup = supervisor(tmp_path, script_text="import time; time.sleep(0.2)", launcher=_LateExits())
    sup.start()
    try:
        events = poll_until(sup, lambda ev: sup.finished)
        assert sup.phase is Phase.SUCCEEDED
        exits = [e for e in events if e.phase is Phase.EXITED and e.subject.startswith("rank:")]
        assert sorted(e.detail["exit_code"] for e in exits) == [0, 0]
    finally:
        sup.stop_all()


def test_the_last_replica_dying_while_another_recovers_is_a_wipe_out(tmp_path) -> None:
    """The two deaths of a wipe-out seen in separate ticks: replica 1 already restarts when
    replica 0's rank dies, so replica 0's restart finds nobody to catch up from and the
    whole job restarts, named a wipe-out as when both are seen in one tick."""
    sup = supervisor(tmp_path, restarts=2, script_text=SCRIPT.replace("3.0", "30.0"))
    sup.start()
    try:
        poll_until(
            sup, lambda ev: any(e.phase is Phase.EXITED for e in ev if e.subject == "replica:1")
        )
        assert sup.execute(Action(ActionKind.RESTART, "replica:1", "exit", "k1")).status is (
            OutcomeStatus.DONE
        )
        sup.launcher.signal(0, signal.SIGKILL)
        events: list = []
        deadline = time.monotonic() + 20
        while not any(e.phase is Phase.EXITED for e in events if e.subject == "replica:0"):
            assert time.monotonic() < deadline, events
            events += sup.poll()  # the tick's actions run before its settle
            time.sleep(0.05)
        outcome = sup.execute(Action(ActionKind.RESTART, "replica:0", "exit", "k2"))
        assert outcome.status is OutcomeStatus.DONE
        assert sup.attempt == 1
        recovering = [e for e in sup.settle() if e.subject == "job" and e.phase is Phase.RECOVERING]
        assert [e.detail["reason"].split(":")[0] for e in recovering] == ["wipe-out"]
    finally:
        sup.stop_all()
