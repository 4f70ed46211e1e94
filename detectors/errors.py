"""Errors of the detectors package."""

from __future__ import annotations


class DetectorError(Exception):
    """Base of every error the detectors raise on misuse or bad configuration."""


class UnknownDetectorError(DetectorError):
    """A detector name that is not registered; the message lists the known names."""
