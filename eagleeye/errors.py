"""Errors of the composition root."""

from __future__ import annotations


class EagleEyeError(Exception):
    """Base of the errors the CLI and the store raise for bad input or configuration."""


class StoreError(EagleEyeError):
    """The run store cannot be opened, migrated or written."""
