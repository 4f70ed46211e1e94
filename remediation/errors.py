"""Errors of the remediation package."""

from __future__ import annotations


class RemediationError(Exception):
    """Base of every error remediation raises on misuse or a bad policy."""


class PolicyError(RemediationError):
    """A policy that cannot be used; the message names the rule and the key."""
