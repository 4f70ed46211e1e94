"""Ladders, cooldowns, rate limits, retry caps, approval and hooks, on a virtual clock."""

from __future__ import annotations

import logging

import pytest

from collector.types import Subject
from detectors.types import Finding, Severity
from ft_runtime.testing import FakeRuntime
from ft_runtime.types import ActionKind, OutcomeStatus
from remediation import Hooks, RemediationError, Remediator, parse_policy

SLOW = """
[policy]
name = "test"
dry_run = false
[limits]
evict = { max = 1, per_s = 3600 }
[[rule]]
kind = "slow_rank"
ladder = [
  { do = ["notify:subject"] },
  { do = ["checkpoint:replica"], after = 3 },
  { do = ["evict:node"], after = 5, after_steps = 25 },
]
"""

NAN = """
[policy]
dry_run = false
[[rule]]
kind = "nan"
ladder = [
  { do = ["skip_batch:replica"] },
  { do = ["rollback:job"], after = 2, max_times = 2, params = { lr_factor = 0.5 } },
]
"""


def finding(kind: str, time: float, step: int, rank: int = 3, node: str = "n1") -> Finding:
    subject = Subject(replica=1, rank=rank, node=node)
    return Finding(kind, subject, 2.0, Severity.WARN, time, step, {"x": 1.0}, "t")


def kinds(decisions) -> list[str]:
    return [f"{d.action.kind.value}:{d.outcome.status.value}" for d in decisions]


def test_a_slow_rank_escalates_notify_checkpoint_evict_once_it_persists(clock) -> None:
    runtime = FakeRuntime(clock=clock)
    rem = Remediator(parse_policy(SLOW), runtime, clock=clock, hooks=Hooks())
    seen = []
    for i in range(6):
        clock.advance(1)
        seen.append(kinds(rem.handle(finding("slow_rank", clock(), step=10 + 5 * i))))
    assert seen[0] == ["notify:done"]
    assert seen[2] == ["checkpoint:done"]
    # Five findings but only 20 steps at the 5th: eviction waits for the 6th (25 steps).
    assert seen[4] == ["checkpoint:done"]
    assert seen[5] == ["evict:done"]
    assert [a.target for a in runtime.actions][-1] == "node:n1"
    decision = rem.handle(finding("slow_rank", clock() + 1, step=60, rank=5, node="n2"))[0]
    assert decision.action.kind is ActionKind.NOTIFY  # another rank: its own incident


def test_evictions_are_rate_limited_per_hour(clock) -> None:
    runtime = FakeRuntime(clock=clock)
    rem = Remediator(
        parse_policy(SLOW.replace("after = 5, after_steps = 25", "after = 1")),
        runtime,
        clock=clock,
        hooks=Hooks(),
    )
    clock.advance(1)
    assert kinds(rem.handle(finding("slow_rank", clock(), 1, rank=0, node="a"))) == ["evict:done"]
    clock.advance(1)
    (refused,) = rem.handle(finding("slow_rank", clock(), 1, rank=1, node="b"))
    assert refused.outcome.status is OutcomeStatus.SKIPPED
    assert "rate limit: at most 1 evict per 3600 s" in refused.outcome.detail
    clock.advance(3601)
    assert kinds(rem.handle(finding("slow_rank", clock(), 2, rank=2, node="c"))) == ["evict:done"]
    assert [a.target for a in runtime.actions] == ["node:a", "node:c"]


def test_cooldown_silences_a_rule_on_its_target(clock) -> None:
    policy = parse_policy(SLOW.replace('kind = "slow_rank"', 'kind = "slow_rank"\ncooldown_s = 10'))
    runtime = FakeRuntime(clock=clock)
    rem = Remediator(policy, runtime, clock=clock, hooks=Hooks())
    clock.advance(1)
    rem.handle(finding("slow_rank", clock(), 1))
    clock.advance(2)
    (quiet,) = rem.handle(finding("slow_rank", clock(), 2))
    assert quiet.outcome.detail.startswith("cooldown")
    clock.advance(10)
    assert kinds(rem.handle(finding("slow_rank", clock(), 3))) == ["checkpoint:done"]
    assert len(runtime.actions) == 2


def test_nan_skips_then_rolls_back_with_lr_decay_up_to_the_retry_cap(clock) -> None:
    runtime = FakeRuntime(clock=clock)
    rem = Remediator(parse_policy(NAN), runtime, clock=clock, hooks=Hooks())
    out = []
    for step in range(5):
        clock.advance(1)
        out.append(rem.handle(finding("nan", clock(), step)))
    assert [kinds(d) for d in out] == [
        ["skip_batch:done"],
        ["rollback:done"],
        ["rollback:done"],
        ["rollback:skipped"],
        ["rollback:skipped"],
    ]
    assert out[1][0].params == {"lr_factor": 0.5}
    assert "retry cap" in out[3][0].outcome.detail
    assert "rung 2/2" in out[1][0].reason


def test_dry_run_is_the_policy_default_and_dedups_by_key(clock) -> None:
    runtime = FakeRuntime(clock=clock)
    rem = Remediator(parse_policy(NAN.replace("dry_run = false", "")), runtime, clock=clock)
    assert rem.dry_run
    f = finding("nan", clock(), 1)
    (first,) = rem.handle(f)
    assert first.outcome.detail.startswith("dry-run")
    (again,) = rem.handle(f)  # the same finding twice: same idempotency key
    assert again.outcome.detail == "duplicate action"
    assert runtime.actions == []


def test_approval_holds_actions_until_approved_or_rejected(clock) -> None:
    policy = parse_policy(SLOW.replace('name = "test"', 'approval = ["notify"]'))
    runtime = FakeRuntime(clock=clock)
    rem = Remediator(policy, runtime, clock=clock, hooks=Hooks())
    clock.advance(1)
    (waiting,) = rem.handle(finding("slow_rank", clock(), 1))
    assert waiting.outcome.detail == "awaiting approval (pending #1)"
    rem.handle(finding("slow_rank", clock() + 1, 2, rank=4, node="n4"))
    assert [p.id for p in rem.pending()] == [1, 2]
    assert runtime.actions == []
    approved = rem.approve(1)
    assert approved.outcome.status is OutcomeStatus.DONE
    rejected = rem.reject(2, "known slow node")
    assert rejected.outcome.detail == "rejected by operator: known slow node"
    assert [a.target for a in runtime.actions] == ["rank:3"]
    assert rem.pending() == []
    with pytest.raises(RemediationError, match="no pending action #7"):
        rem.approve(7)


def test_decorated_hooks_see_their_kinds_and_raising_ones_are_logged(clock, caplog) -> None:
    hooks = Hooks()
    seen: list[str] = []

    @hooks.on_finding(kind="nan")
    def nan_only(f: Finding) -> None:
        seen.append(f"finding:{f.kind}")

    @hooks.on_action(kind="skip_batch")
    def skips(d) -> None:
        seen.append(f"action:{d.action.kind.value}")

    @hooks.on_finding()
    def broken(f: Finding) -> None:
        raise ValueError("user bug")

    rem = Remediator(parse_policy(NAN), FakeRuntime(clock=clock), clock=clock, hooks=hooks)
    with caplog.at_level(logging.ERROR):
        decisions = rem.handle(finding("nan", clock(), 1))
        rem.handle(finding("slow_rank", clock(), 1))
    assert len(decisions) == 1
    assert seen == ["finding:nan", "action:skip_batch"]
    assert "user bug" in caplog.text


def test_decisions_serialise_with_their_reason(clock) -> None:
    rem = Remediator(parse_policy(NAN), FakeRuntime(clock=clock), clock=clock, hooks=Hooks())
    (d,) = rem.handle(finding("nan", clock(), 1))
    data = d.to_json()
    assert data["outcome"]["action"]["kind"] == "skip_batch"
    assert data["finding"]["kind"] == "nan"
    assert "nan on rank 3 seen 1x" in data["reason"]


def test_module_level_decorators_reach_remediators_without_their_own_hooks(clock) -> None:
    from remediation import DEFAULT_HOOKS, on_action, on_finding

    seen: list[str] = []
    before = (len(DEFAULT_HOOKS.finding_hooks), len(DEFAULT_HOOKS.action_hooks))
    try:

        @on_finding(kind="nan")
        def f(finding: Finding) -> None:
            seen.append("finding")

        @on_action()
        def a(decision) -> None:
            seen.append(decision.action.kind.value)

        Remediator(parse_policy(NAN), FakeRuntime(clock=clock), clock=clock).handle(
            finding("nan", clock(), 1)
        )
    finally:
        del DEFAULT_HOOKS.finding_hooks[before[0] :]
        del DEFAULT_HOOKS.action_hooks[before[1] :]
    assert seen == ["finding", "skip_batch"]
