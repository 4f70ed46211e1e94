"""Extension points of the collector."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, runtime_checkable

from collector.types import Sample


@runtime_checkable
class Source(Protocol):
    """Anything that yields Samples when asked (an exporter scrape, a log tail, NVML)."""

    def collect(self) -> Iterable[Sample]:
        """Returns the samples available now. Must not block for long and must not raise
        for bad input it can skip: a source counts and drops what it cannot parse."""
        ...
