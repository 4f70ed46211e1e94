"""Bookkeeping of the remediator: incidents, cooldowns and sliding-window rate limits."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from ft_runtime.types import ActionKind
from remediation.policy import Limit


@dataclass
class Incident:
    """How often one rule has seen one fault, since when, and how often each rung fired."""

    count: int = 0
    first_step: int | None = None
    last_step: int | None = None
    last_time: float = float("-inf")
    fired: dict[int, int] = field(default_factory=dict)

    @property
    def steps(self) -> int:
        if self.first_step is None or self.last_step is None:
            return 0
        return self.last_step - self.first_step


class Incidents:
    """Incidents keyed by (rule index, finding key); one ends after a quiet ``reset_after_s``."""

    def __init__(self) -> None:
        self._open: dict[tuple[int, str], Incident] = {}
        self._seen: set[tuple[int, str, float]] = set()

    def see(self, rule: int, key: str, time: float, step: int | None, reset_s: float) -> Incident:
        incident = self._open.get((rule, key))
        if incident is not None and (rule, key, time) in self._seen:
            return incident  # the same finding again (a resent alert) does not escalate
        self._seen.add((rule, key, time))
        if incident is None or time - incident.last_time > reset_s:
            incident = self._open[(rule, key)] = Incident()
        incident.count += 1
        incident.last_time = max(incident.last_time, time)
        if step is not None:
            incident.first_step = step if incident.first_step is None else incident.first_step
            incident.last_step = step
        return incident


class RateLimiter:
    """Counts executed actions per kind in a sliding window."""

    def __init__(self, limits: Sequence[Limit]) -> None:
        self._limits = {limit.action: limit for limit in limits}
        self._times: dict[ActionKind, deque[float]] = {k: deque() for k in self._limits}

    def refusal(self, kind: ActionKind, now: float) -> str | None:
        """Why an action of ``kind`` may not run now, or None when it may."""
        limit = self._limits.get(kind)
        if limit is None:
            return None
        times = self._times[kind]
        while times and times[0] <= now - limit.per_s:
            times.popleft()
        if len(times) >= limit.max:
            return f"rate limit: at most {limit.max} {kind.value} per {limit.per_s:g} s"
        return None

    def record(self, kind: ActionKind, now: float) -> None:
        if kind in self._times:
            self._times[kind].append(now)


class Cooldowns:
    """The time until which a rule stays silent on a target after it acted there."""

    def __init__(self) -> None:
        self._until: dict[tuple[int, str], float] = {}

    def refusal(self, rule: int, target: str, now: float) -> str | None:
        until = self._until.get((rule, target))
        if until is not None and now < until:
            return f"cooldown: rule quiet on {target} for {until - now:.1f} s more"
        return None

    def start(self, rule: int, target: str, now: float, seconds: float) -> None:
        if seconds > 0:
            self._until[(rule, target)] = now + seconds
