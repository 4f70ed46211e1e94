"""The controller's tick is never blocked by a command in flight: a checkpoint decided for a
finding is recorded as pending at once, the ticks go on while no replica has answered, and
the tick that sees the last answer (or the deadline) records the final outcome for the same
finding. Replicas are fake (a fake launcher); the quorum store and the run store are real."""

from __future__ import annotations

from pathlib import Path

import pytest

from collector.transport import TelemetryReceiver
from collector.types import JOB
from detectors.types import Finding, Severity
from eagleeye.controller import Controller
from eagleeye.store import RunReader, RunStore
from ft_runtime.layout import JobLayout
from ft_runtime.quorum import QuorumService
from ft_runtime.replica import ReplicaSupervisor
from ft_runtime.replica.protocol import Answer, Refused, Saved, encode, key_answer
from ft_runtime.supervisor import LaunchSpec
from ft_runtime.testing import FakeLauncher
from ft_runtime.types import OutcomeStatus
from remediation.config import parse_policy
from remediation.remediator import Remediator
from tests.ft_runtime.test_replica_controller import Timer

POLICY = """
[[rule]]
kind = "loss_spike"
ladder = [{ do = ["checkpoint:job"] }]
"""


class Rig:
    def __init__(self, tmp_path: Path, start: bool = True) -> None:
        launch = LaunchSpec(["train.py"], JobLayout(2, 1, 2), "t", str(tmp_path / "logs"))
        self.timer = Timer()
        self.launcher = FakeLauncher()
        self.sup = ReplicaSupervisor(
            launch, QuorumService(2, 1), launcher=self.launcher, timer=self.timer
        )
        self.receiver = TelemetryReceiver()
        self.run_dir = tmp_path
        self.store = RunStore(tmp_path)
        self.remediator = Remediator(parse_policy(POLICY), self.sup, dry_run=False)
        self.findings = [Finding("loss_spike", JOB, 9.0, Severity.WARN, 1.0, 12)]
        self.controller = Controller(
            self.sup,
            self.receiver,
            self.store,
            [],
            self.remediator,
            tick_s=0.001,
            inbox=self._inbox,
        )
        if start:
            self.sup.start()

    def _inbox(self) -> list[Finding]:
        found, self.findings = self.findings, []
        return found

    def answer(self, replica: int, body: Answer) -> None:
        assert self.sup.quorum.store is not None
        self.sup.quorum.store.set(key_answer(1, replica), encode(body))

    def actions(self) -> list[tuple[str, str, int]]:
        self.store.flush()
        with RunReader(self.run_dir) as reader:
            rows = reader.actions()
        return list(zip(rows["status"], rows["key"], rows["finding_id"], strict=True))

    def close(self) -> None:
        self.sup.stop_all()
        self.receiver.close()
        self.store.close()


@pytest.fixture
def rig(tmp_path):
    made = Rig(tmp_path)
    yield made
    made.close()


def test_the_tick_goes_on_while_a_checkpoint_is_in_flight(rig) -> None:
    rig.controller.tick()  # the finding comes in: the checkpoint is sent, nobody answered
    ((status, key, finding),) = rig.actions()
    assert status == "pending"
    assert finding is not None
    for _ in range(5):  # ticks that return with the command still in flight
        rig.controller.tick()
    assert rig.sup.pending() == 1
    assert rig.remediator.running() == 1
    rig.answer(0, Saved(12, "/ckpt/12"))
    rig.answer(1, Refused("not the source"))
    rig.controller.tick()
    assert rig.actions() == [("pending", key, finding), ("done", key, finding)]
    final = rig.controller.report.decisions[-1]
    assert final.outcome.status is OutcomeStatus.DONE
    assert final.outcome.data["path"] == "/ckpt/12"
    assert rig.remediator.running() == 0


def test_a_command_nobody_answers_is_recorded_failed_at_its_deadline(rig) -> None:
    rig.controller.tick()
    rig.answer(0, Saved(12, "/ckpt/12"))
    rig.timer.now = 29.0
    rig.controller.tick()
    assert [row[0] for row in rig.actions()] == ["pending"]
    rig.timer.now = 31.0
    rig.controller.tick()
    assert [row[0] for row in rig.actions()] == ["pending", "failed"]
    final = rig.controller.report.decisions[-1].outcome
    assert final.detail == "checkpoint #1: no answer from replicas [1] within 30 s"
    rig.store.flush()
    with RunReader(rig.run_dir) as reader:
        events = reader.events()
    assert set(events[events["subject"] == "controller"]["phase"]) == set()  # no tick failed
    command = events[events["subject"] == "command:1"].iloc[0]
    assert command["phase"] == "failed"
    assert command["detail"]["missing"] == [1]


def test_a_command_the_job_end_cut_short_gets_its_final_outcome_recorded(tmp_path) -> None:
    rig = Rig(tmp_path, start=False)
    ticks = 0

    def inbox() -> list[Finding]:
        nonlocal ticks
        ticks += 1
        if ticks == 3:  # both replicas finish training before they answered
            rig.launcher.exit(0, 0)
            rig.launcher.exit(1, 0)
        return rig._inbox()

    rig.controller.inbox = inbox
    try:
        report = rig.controller.run()
        assert report.succeeded
        assert [row[0] for row in rig.actions()] == ["pending", "failed"]
        final = report.decisions[-1].outcome
        assert final.detail == (
            "checkpoint #1: replicas [0, 1] left the quorum or ended before answering"
        )
    finally:
        rig.close()
