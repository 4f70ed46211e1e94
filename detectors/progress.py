"""Progress: a job is hung only on evidence that it cannot go on, never on silence alone.

A rank that stops completing steps is not hung by that fact: it may be evaluating, saving a
checkpoint, or starting up. The evidence that it cannot go on comes from three places:

- **its process** (``/proc``, as ``proc_*`` frames): stopped (SIGSTOP, state ``T``) for
  ``stopped_k`` median step times (at least ``stopped_s``), or in uninterruptible sleep
  (state ``D``) without gaining CPU time for ``blocked_s``;
- **its peers**: they wait in a collective (``in_collective``) that it never entered, while
  its main thread has gained no CPU time for ``idle_s`` (a deadlock; a busy rank is
  working, however long, and a sleeping one may be waiting on a service);
- **the collective**: every rank has waited in it for ``collective_s`` (and for the silence
  limit, ``k`` median step times, at least ``min_silence_s``): it will not complete.

A hang is one finding on the culprit (the stopped, blocked or idle rank, or their node),
with the ranks waiting for it in its evidence; a waiting rank is never the culprit. A pause
the loop declares (``pause`` 1 ... 0: evaluation, a checkpoint save) is not idleness and
not blocking. When every rank is stopped at once the job was suspended (a scheduler's
SIGSTOP), which is no hang. A rank that has sent no step is of unknown progress: only its
process can show it hung, and ``progress()`` reports it as ``unknown``.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from collector.types import JOB, Frame, Subject
from detectors._liveness import RankLiveness
from detectors.errors import DetectorError
from detectors.types import Finding, Severity

#: Frames from the rank processes' /proc entries (the controller samples them).
PROC_FEATURES = frozenset({"proc_stopped", "proc_blocked", "proc_cpu_s"})
_LISTED = 8  # ranks named one by one in a finding's evidence


#: Seconds into an attempt after which the ranks that have sent no step (their progress
#: unknown, never a hang by itself) are announced: ``eagleeye run --no-step-notice``.
NO_STEP_NOTICE_S = 60.0


@dataclass(frozen=True, slots=True)
class HangLimits:
    """The limits of hang detection: flags of ``eagleeye run`` (``--hang-k``,
    ``--hang-stopped-s``, ...) and keys of the ``[hang]`` table of the detectors' config.

    Attributes:
        k: silence limit in median step times (the floor of every waiting verdict).
        min_silence_s: a floor on that limit.
        stopped_k: median step times a rank must stay stopped.
        stopped_s: a floor on that, and the limit when no step time is known.
        blocked_s: uninterruptible sleep without CPU time that counts as hung.
        idle_s: a main thread without CPU time while peers wait for it.
        collective_s: every rank waiting in a collective this long: it never completes.
    """

    k: float = 10.0
    min_silence_s: float = 5.0
    stopped_k: float = 2.0
    stopped_s: float = 0.25
    blocked_s: float = 60.0
    idle_s: float = 600.0
    collective_s: float = 120.0

    def __post_init__(self) -> None:
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if not isinstance(value, int | float) or not value > 0:
                raise DetectorError(f"hang limit {name} must be a number above 0, got {value!r}")

    @classmethod
    def from_mapping(cls, values: Mapping[str, object], origin: str = "hang limits") -> HangLimits:
        """Limits from a table; an unknown key is an error naming the known ones."""
        unknown = set(values) - set(cls.__dataclass_fields__)
        if unknown:
            known = ", ".join(cls.__dataclass_fields__)
            raise DetectorError(f"{origin}: unknown hang limit {sorted(unknown)}; known: {known}")
        return cls(**values)  # type: ignore[arg-type]


class ProgressStall:
    """Fires ``hang`` on evidence of no progress (see the module).

    Args:
        window: steps of step-time history for the median.
        limits: the ``HangLimits`` fields, by name.

    Feature contract: ``step_time`` a completed step; ``launched`` a (re)launch;
    ``closing`` the end of training; ``exit_code`` an exit; ``job_restart`` a new attempt
    of the whole job (step times are forgotten); ``in_collective`` > 0 the seconds a rank
    has waited in an open collective, 0 the end of that wait; ``pause`` 1 or 0; and
    ``proc_stopped``, ``proc_blocked`` (1 or 0), ``proc_cpu_s`` (its main thread's).

    >>> from collector.types import Frame, Subject
    >>> det = ProgressStall(k=2.0, min_silence_s=1.0, stopped_s=0.5)
    >>> for rank in (0, 1):
    ...     _ = det.process(Frame(Subject(0, rank), 5, 10.0, {"step_time": 0.1}))
    >>> _ = det.process(Frame(Subject(0, 1), None, 10.1, {"proc_stopped": 1.0}))
    >>> _ = det.process(Frame(Subject(0, 0), 6, 10.4, {"in_collective": 0.3}))
    >>> [(f.kind, f.subject.rank, f.evidence["waiting_rank_0"]) for f in det.poll(10.7)]
    [('hang', 1, 0.0)]
    """

    name = "progress_stall"

    def __init__(self, window: int = 256, **limits: float) -> None:
        self.limits = HangLimits(**limits)
        self.window = window
        self._ranks: dict[Subject, RankLiveness] = {}
        self._step_times: deque[float] = deque(maxlen=window)
        self._job_fired = False

    def process(self, frame: Frame) -> Sequence[Finding]:
        values, subject, now = frame.values, frame.subject, frame.time
        if "job_restart" in values:
            self._step_times.clear()
            self._job_fired = False
        if subject.rank is None:
            return ()
        if "exit_code" in values:
            self._ranks.pop(subject, None)
            return ()
        if "launched" in values:
            self._ranks[subject] = RankLiveness(now)
            return ()
        rank = self._ranks.get(subject)
        if rank is None:  # telemetry from before a launch was seen: track it all the same
            rank = self._ranks[subject] = RankLiveness(now)
        if "step_time" in values:
            self._step_times.append(values["step_time"])
            rank.stepped_at(now, frame.step)
            self._job_fired = False
        rank.update(values, now, frame.step)
        return ()

    # ---- limits ---------------------------------------------------------------------------
    def median_step(self) -> float | None:
        return statistics.median(self._step_times) if self._step_times else None

    def silence_limit(self) -> float | None:
        """Seconds without a step that a waiting verdict also needs; None before any step."""
        median = self.median_step()
        return None if median is None else max(self.limits.k * median, self.limits.min_silence_s)

    def stopped_limit(self) -> float:
        median = self.median_step()
        return (
            self.limits.stopped_s
            if median is None
            else max(self.limits.stopped_k * median, self.limits.stopped_s)
        )

    # ---- verdicts -------------------------------------------------------------------------
    def poll(self, now: float) -> Sequence[Finding]:
        ranks = self._ranks
        live = {s: r for s, r in ranks.items() if not r.closing}  # still training
        for reason, culprits, held in self._suspects(live, now):
            fresh = {s: d for s, d in culprits.items() if not ranks[s].fired}
            if fresh:
                return (self._finding(reason, fresh, held, now),)
        return self._never_completes(live, now) if live else []

    def _suspects(
        self, live: Mapping[Subject, RankLiveness], now: float
    ) -> list[tuple[str, dict[Subject, float], float]]:
        """(reason, {culprit: how long}, the limit it passed), strongest evidence first.
        A rank that closed its session can still be stopped or blocked; only the ranks
        still training can be idle while others wait."""
        ranks = self._ranks
        stop_limit = self.stopped_limit()
        stopped = {s: r.stopped_for(now) for s, r in ranks.items()}
        stopped = {s: d for s, d in stopped.items() if d >= stop_limit}
        if len(stopped) == len(ranks):
            stopped = {}  # everyone stopped at once: suspended, not hung
        blocked = {s: r.blocked_for(now) for s, r in ranks.items()}
        blocked = {s: d for s, d in blocked.items() if d >= self.limits.blocked_s}
        idle: dict[Subject, float] = {}
        if any(r.waiting_since is not None for r in live.values()):
            floor = max(self.limits.idle_s, self.silence_limit() or 0.0)
            idle = {s: r.idle_for(now) for s, r in live.items() if r.waiting_since is None}
            idle = {s: d for s, d in idle.items() if d >= floor and now - live[s].since >= floor}
        return [
            ("stopped", stopped, stop_limit),
            ("blocked", blocked, self.limits.blocked_s),
            ("idle", idle, self.limits.idle_s),
        ]

    def _never_completes(self, live: Mapping[Subject, RankLiveness], now: float) -> list[Finding]:
        since = [r.waiting_since for r in live.values()]
        if self._job_fired or any(t is None for t in since):
            return []
        waited = now - max(t for t in since if t is not None)
        limit = max(self.limits.collective_s, self.silence_limit() or 0.0)
        if waited < limit:
            return []
        self._job_fired = True
        evidence = {"collective_never_completes": 1.0, "waited_s": waited, "limit_s": limit}
        evidence.update(self._listed("waiting_rank", list(live)))
        evidence["ranks_waiting"] = float(len(live))
        step = _last_step(live.values())
        score = waited / limit
        return [Finding("hang", JOB, score, Severity.CRITICAL, now, step, evidence, self.name)]

    def _finding(
        self,
        reason: str,
        culprits: Mapping[Subject, float],
        limit: float,
        now: float,
    ) -> Finding:
        ranks = self._ranks
        for subject in culprits:
            ranks[subject].fired = True
        waiting = [s for s, r in ranks.items() if r.waiting_since is not None]
        held = max(culprits.values())
        named = [ranks[s] for s in culprits]
        evidence = {
            reason: 1.0,
            f"{reason}_s": held,
            "limit_s": limit,
            "silence_s": max(now - r.since for r in named),
            "ranks_waiting": float(len(waiting)),
            "progress_unknown": float(not any(r.stepped for r in named)),
        }
        evidence.update(self._listed("culprit_rank", list(culprits)))
        evidence.update(self._listed("waiting_rank", waiting))
        step = _last_step(named)
        if step is not None:
            evidence["last_step"] = float(step)
        subject = culprit_subject(list(culprits), len(ranks))
        return Finding(
            "hang", subject, held / limit, Severity.CRITICAL, now, step, evidence, self.name
        )

    @staticmethod
    def _listed(prefix: str, subjects: list[Subject]) -> dict[str, float]:
        ranks = sorted(s.rank for s in subjects if s.rank is not None)
        return {f"{prefix}_{i}": float(rank) for i, rank in enumerate(ranks[:_LISTED])}

    def progress(self, now: float) -> dict[Subject, str]:
        """Each tracked rank's state: stepping, waiting, paused, stopped, blocked, closing,
        or unknown (it has sent no step since its launch)."""
        return {s: r.state(now) for s, r in self._ranks.items()}


def _last_step(ranks: Iterable[RankLiveness]) -> int | None:
    steps = [r.step for r in ranks if r.step is not None]
    return max(steps) if steps else None


def culprit_subject(culprits: list[Subject], live: int) -> Subject:
    """The subject of a hang's finding: its one culprit rank, the node all culprits share
    (fewer than the ``live`` ranks), or the job."""
    if len(culprits) == 1:
        return culprits[0]
    nodes = {s.node for s in culprits}
    if len(culprits) < live and len(nodes) == 1 and None not in nodes:
        return Subject(node=nodes.pop())
    return JOB
