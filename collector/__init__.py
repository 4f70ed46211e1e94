"""Turns what ranks and nodes report into Samples and Frames for the detectors and the store."""

from __future__ import annotations

from collector.base import Source
from collector.errors import CollectorError, ParseError
from collector.types import JOB, Frame, Sample, Subject

__all__ = ["JOB", "CollectorError", "Frame", "ParseError", "Sample", "Source", "Subject"]
