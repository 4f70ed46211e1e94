"""A graceful stop's timing, shared by the coordinators of both recoveries (job and
replica): the grace period a stop has (the controller's ``--grace-period``, or less when
an agent that leaves on its own signal gives less), at most half of it spent waiting for
the checkpoint asked for first, and what is left of it for the ranks to end."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GraceWindow:
    """A stop's grace period, from the moment the stop began."""

    grace_s: float
    started: float
    clock: Callable[[], float]

    @classmethod
    def start(cls, grace_s: float, clock: Callable[[], float]) -> GraceWindow:
        return cls(grace_s, clock(), clock)

    def wait(self, poll: Callable[[], None], done: Callable[[], bool], share: float = 0.5) -> bool:
        """Polls until ``done()`` or ``share`` of the grace period (half) is spent;
        returns ``done()``."""
        deadline = self.started + self.grace_s * share
        while self.clock() < deadline and not done():
            poll()
        return done()

    def left(self) -> float | None:
        """What is left of the grace period for the ranks to end; None with no grace
        period (the agents' own then)."""
        if self.grace_s <= 0:
            return None
        return max(self.started + self.grace_s - self.clock(), 0.0)


def stop_grace(grace_s: float, agent_grace: float | None) -> float:
    """The grace period of a stop: the controller's, or an agent's that left on its own
    signal (it gives no more than its own, ``agent_grace``)."""
    return grace_s if agent_grace is None else agent_grace


def leaving_grace(grace_s: float, given: object) -> float:
    """The grace an agent leaving on its own signal gives the stop: its own (``given``,
    from its ``leaving`` report), at most the controller's."""
    return min(grace_s, seconds(given))


def seconds(value: object) -> float:
    """A duration an agent gave: a finite number of seconds from 0, else 0."""
    try:
        found = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0.0
    return found if math.isfinite(found) and found > 0 else 0.0


__all__ = ["GraceWindow", "leaving_grace", "seconds", "stop_grace"]
