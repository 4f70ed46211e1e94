from __future__ import annotations

import os

import pytest

# Each rank process gets one thread: the machines this runs on have few cores.
os.environ.setdefault("OMP_NUM_THREADS", "1")


class VirtualClock:
    """A clock tests move by hand, so timeouts are tested without sleeping."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()
