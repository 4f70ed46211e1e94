"""Errors of the collector package."""

from __future__ import annotations


class CollectorError(Exception):
    """Base of every error the collector raises on misuse or bad input."""


class ParseError(CollectorError):
    """Input that is not in the expected format; the message says what and where."""
