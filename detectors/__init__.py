"""Frames in, Findings out: what is wrong, where, and the evidence that shows it."""

from __future__ import annotations

from detectors.base import Detector, StreamingDetector
from detectors.errors import DetectorError, UnknownDetectorError
from detectors.progress import ProgressStall
from detectors.registry import DETECTORS, create, load_plugins, register
from detectors.rules import NonFiniteLoss, ProcessExit
from detectors.types import Finding, Severity

__all__ = [
    "DETECTORS",
    "Detector",
    "DetectorError",
    "Finding",
    "NonFiniteLoss",
    "ProcessExit",
    "ProgressStall",
    "Severity",
    "StreamingDetector",
    "UnknownDetectorError",
    "create",
    "load_plugins",
    "register",
]
