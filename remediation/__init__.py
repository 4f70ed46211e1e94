"""Findings in, actions out: policies, ladders, limits, approval, hooks and the audit trail."""

from __future__ import annotations

from remediation.config import builtin_policy, load_policy, parse_policy
from remediation.errors import PolicyError, RemediationError
from remediation.hooks import DEFAULT_HOOKS, Hooks, on_action, on_finding
from remediation.policy import (
    Limit,
    Policy,
    Rule,
    Rung,
    Step,
    cluster_replica_policy,
    cluster_restart_policy,
    replica_restart_policy,
    synchronous_restart_policy,
)
from remediation.remediator import Decision, PendingAction, Remediator

__all__ = [
    "DEFAULT_HOOKS",
    "Decision",
    "Hooks",
    "Limit",
    "PendingAction",
    "Policy",
    "PolicyError",
    "RemediationError",
    "Remediator",
    "Rule",
    "Rung",
    "Step",
    "builtin_policy",
    "cluster_replica_policy",
    "cluster_restart_policy",
    "load_policy",
    "on_action",
    "on_finding",
    "parse_policy",
    "replica_restart_policy",
    "synchronous_restart_policy",
]
