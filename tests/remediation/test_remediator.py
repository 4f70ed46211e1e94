from __future__ import annotations

import dataclasses

import pytest

from collector.types import Subject
from detectors.types import Finding, Severity
from ft_runtime.testing import FakeRuntime
from ft_runtime.types import Action, ActionKind, Outcome, OutcomeStatus
from remediation import (
    PolicyError,
    Remediator,
    Rule,
    replica_restart_policy,
    synchronous_restart_policy,
)


def exit_finding(time: float, rank: int = 3, step: int = 40) -> Finding:
    return Finding(
        "process_exit",
        Subject(replica=1, rank=rank, node="node1"),
        1.0,
        Severity.CRITICAL,
        time,
        step,
        {"exit_code": -9},
        "process_exit",
    )


def test_dry_run_is_the_default_and_executes_nothing(clock) -> None:
    runtime = FakeRuntime(clock=clock)
    remediator = Remediator(synchronous_restart_policy(), runtime, clock=clock)
    (decision,) = remediator.handle(exit_finding(clock()))
    assert decision.dry_run
    assert decision.outcome.status is OutcomeStatus.SKIPPED
    assert "dry-run" in decision.outcome.detail
    assert runtime.actions == []


def test_an_exit_restarts_the_job_once_and_later_findings_of_it_are_answered(clock) -> None:
    runtime = FakeRuntime(clock=clock)
    remediator = Remediator(synchronous_restart_policy(), runtime, dry_run=False, clock=clock)
    first = exit_finding(clock())
    clock.advance(1)  # the restart happens a second after the exit
    (decision,) = remediator.handle(first)
    assert decision.action.kind is ActionKind.RESTART
    assert decision.action.target == "job"
    assert decision.outcome.status is OutcomeStatus.DONE
    # The same finding again, and one about the old incarnation (a peer that died of the
    # first death before the restart), cause nothing more.
    assert remediator.handle(first) == []
    assert remediator.handle(exit_finding(first.time + 0.5, rank=2)) == []
    # A new failure after the restart is a new incident.
    clock.advance(1)
    assert len(remediator.handle(exit_finding(clock()))) == 1
    assert len(runtime.actions) == 2


def test_a_raising_runtime_and_raising_hooks_yield_a_failed_outcome_not_a_crash(clock) -> None:
    class Exploding(FakeRuntime):
        def execute(self, action):
            raise OSError("no such process")

    remediator = Remediator(synchronous_restart_policy(), Exploding(), dry_run=False, clock=clock)
    seen = []
    remediator.on_finding(lambda f: 1 / 0)
    remediator.on_decision(lambda d: seen.append(d.outcome.status))
    remediator.on_decision(lambda d: 1 / 0)
    (decision,) = remediator.handle(exit_finding(clock()))
    assert decision.outcome.status is OutcomeStatus.FAILED
    assert "no such process" in decision.outcome.detail
    assert seen == [OutcomeStatus.FAILED]


def test_rules_target_the_scope_they_name() -> None:
    finding = exit_finding(0.0)
    assert Rule("process_exit", ActionKind.RESTART, "replica").target(finding) == "replica:1"
    assert Rule("process_exit", ActionKind.EVICT, "node").target(finding) == "node:node1"
    assert Rule("process_exit", ActionKind.NOTIFY, "subject").target(finding) == "rank:3"
    assert not Rule("process_exit", ActionKind.NOTIFY, min_severity=Severity.CRITICAL).matches(
        Finding("process_exit", Subject(rank=1), 0.5, Severity.WARN, 0.0, 1)
    )
    with pytest.raises(PolicyError, match="scope 'rack'"):
        Rule("process_exit", ActionKind.EVICT, "rack")


class _JobRestartingRuntime(FakeRuntime):
    """A replica restart that found no replica to catch up from and restarted the whole
    job, as the replica supervisor does (its outcome names the new attempt)."""

    def execute(self, action: Action) -> Outcome:
        self.actions.append(action)
        return Outcome(action, OutcomeStatus.DONE, "whole job", self.clock(), {"attempt": 1})


def test_a_restart_that_became_the_jobs_answers_every_earlier_finding(clock) -> None:
    """Two replicas' ranks killed in one step: the first finding's replica restart became
    a job restart; the second replica's exit, from before it, restarts nothing more."""
    runtime = _JobRestartingRuntime(clock=clock)
    remediator = Remediator(replica_restart_policy(), runtime, dry_run=False, clock=clock)
    first, second = exit_finding(clock(), rank=3), exit_finding(clock(), rank=1)
    second = dataclasses.replace(second, subject=Subject(replica=0, rank=1, node="node0"))
    clock.advance(0.1)
    assert [d.outcome.status for d in remediator.handle(first)] == [OutcomeStatus.DONE]
    assert remediator.handle(second) == []  # answered by the job's restart
    assert [a.target for a in runtime.actions] == ["replica:1"]
    clock.advance(1)
    later = dataclasses.replace(second, time=clock())  # a new failure after it is answered
    assert [d.action.target for d in remediator.handle(later)] == ["replica:0"]
