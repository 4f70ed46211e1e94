"""Findings in, actions out: policies, dry-run by default, hooks and the audit trail."""

from __future__ import annotations

from remediation.errors import PolicyError, RemediationError
from remediation.policy import Policy, Rule, synchronous_restart_policy
from remediation.remediator import Decision, Remediator

__all__ = [
    "Decision",
    "Policy",
    "PolicyError",
    "RemediationError",
    "Remediator",
    "Rule",
    "synchronous_restart_policy",
]
