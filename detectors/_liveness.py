"""One rank's liveness as the progress detector sees it: its steps, its waits and pauses,
and what its process's /proc entry says (stopped, blocked, gaining CPU time)."""

from __future__ import annotations

from collections.abc import Mapping


class RankLiveness:
    """Mutable state of one rank, kept inside ``ProgressStall``.

    Args:
        now: when it was launched (or first heard of).
    """

    def __init__(self, now: float) -> None:
        self.since = now  # last progress: launch, step, end of a wait or of a pause
        self.step: int | None = None
        self.stepped = False
        self.closing = False
        self.fired = False
        self.paused = False
        self.waiting_since: float | None = None
        self.stopped_since: float | None = None
        self.blocked_since: float | None = None
        self.cpu: float | None = None
        self.cpu_since = now  # when its main thread's CPU time last grew

    def stepped_at(self, now: float, step: int | None) -> None:
        self.since, self.step, self.stepped, self.fired = now, step, True, False
        self.waiting_since = None
        self.closing = False

    def update(self, values: Mapping[str, float], now: float, step: int | None) -> None:
        """Takes the non-step features of a frame (see ``ProgressStall``)."""
        if "closing" in values:
            self.closing = True
            self.waiting_since = None
        if "in_collective" in values:
            waited = values["in_collective"]
            if waited > 0:
                if self.waiting_since is None:
                    self.waiting_since = now - waited
            elif self.waiting_since is not None:  # the wait is over: that is progress
                self.waiting_since, self.since = None, now
        if "pause" in values:
            paused = values["pause"] > 0
            if self.paused and not paused:
                self.since = now
            self.paused = paused
        self._proc(values, now)
        if self.step is None and step is not None:
            self.step = step

    def _proc(self, values: Mapping[str, float], now: float) -> None:
        if "proc_stopped" in values:
            self.stopped_since = _since(values["proc_stopped"], self.stopped_since, now)
        if "proc_blocked" in values:
            self.blocked_since = _since(values["proc_blocked"], self.blocked_since, now)
        if "proc_cpu_s" in values:
            cpu = values["proc_cpu_s"]
            if self.cpu is None or cpu > self.cpu:
                self.cpu_since = now
            self.cpu = cpu

    def stopped_for(self, now: float) -> float:
        return 0.0 if self.stopped_since is None else now - self.stopped_since

    def blocked_for(self, now: float) -> float:
        """Seconds in uninterruptible sleep without CPU time or progress (0 when paused)."""
        if self.blocked_since is None or self.paused:
            return 0.0
        return now - max(self.blocked_since, self.cpu_since, self.since)

    def idle_for(self, now: float) -> float:
        """Seconds its main thread has gained no CPU time (0 when paused or unknown)."""
        if self.paused or self.cpu is None:
            return 0.0
        return now - max(self.cpu_since, self.since)

    def state(self, now: float) -> str:
        if self.stopped_since is not None:
            return "stopped"
        if self.closing:
            return "closing"
        if self.blocked_since is not None and self.blocked_for(now) > 1.0:
            return "blocked"
        if self.paused:
            return "paused"
        if self.waiting_since is not None:
            return "waiting"
        return "stepping" if self.stepped else "unknown"


def _since(flag: float, since: float | None, now: float) -> float | None:
    """When a state a look shows (flag 1) began: kept while it lasts, None once it ends."""
    if flag <= 0:
        return None
    return now if since is None else since
