"""Hung collectives: who never joined, who joined and waits.

Every rank reports when it completes a step (``step_time``) and whether it is waiting
inside the current collective (``in_collective``, from per-rank collective enter/exit
events or a flight-recorder dump). When no rank has progressed for ``k`` times the median
step time, the ranks that never entered the collective are the ones the others wait for:
the wait-for graph's sinks. The finding names them (one rank, their node, or the job).
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Sequence

import numpy as np

from collector.types import JOB, Frame, Subject
from detectors._layout import RankLayout, to_slots
from detectors._series import job_value
from detectors.stepbatch import StepBatch
from detectors.types import Finding, Severity


class CollectiveHang:
    """Fires ``hang`` on a stalled job, localised to the ranks that never joined.

    Args:
        k: silence, in median step times, that counts as a hang.
        min_silence_s: a floor on that silence, for very short steps.
        window: steps of step-time history for the median.

    >>> det = CollectiveHang(k=2.0)
    >>> from collector.types import Frame, Subject
    >>> for s in range(5):
    ...     for r in range(4):
    ...         _ = det.process(Frame(Subject(0, r, "n0"), s, float(s), {"step_time": 1.0}))
    >>> for r in (0, 1, 3):
    ...     _ = det.process(Frame(Subject(0, r, "n0"), 5, 4.5, {"in_collective": 1.0}))
    >>> [(f.kind, str(f.subject)) for f in det.poll(7.0)]
    [('hang', 'rank 2')]
    """

    name = "collective_hang"

    def __init__(self, k: float = 2.0, min_silence_s: float = 0.5, window: int = 64) -> None:
        self.k, self.min_silence_s, self.window = k, min_silence_s, window
        self._layout = RankLayout()
        self._progress = np.zeros(0)
        self._step = np.zeros(0)
        self._joined = np.zeros(0, dtype=bool)
        self._step_times: deque[float] = deque(maxlen=window)
        self._fired = False

    def process(self, frame: Frame) -> Sequence[Finding]:
        if frame.subject.rank is None:
            return ()
        ranks = np.array([frame.subject.rank])
        nodes = np.array([frame.subject.node or ""], dtype=object)
        step_time = frame.values.get("step_time", np.nan)
        joined = frame.values.get("in_collective", np.nan)
        self._update(
            ranks, nodes, np.array([step_time]), np.array([joined]), frame.time, frame.step
        )
        if not np.isnan(step_time):
            self._step_times.append(float(step_time))
        return ()

    def process_step(self, batch: StepBatch) -> Sequence[Finding]:
        """Updates every rank of a step at once, then checks for a hang at the step's time."""
        self._update(
            batch.ranks,
            batch.nodes,
            batch.column("step_time"),
            batch.column("in_collective"),
            batch.time,
            batch.step,
        )
        typical = job_value(batch, "step_time")
        if typical is not None:
            self._step_times.append(typical)
        return self.poll(batch.time)

    def _update(
        self,
        ranks: np.ndarray,
        nodes: np.ndarray,
        step_time: np.ndarray,
        joined: np.ndarray,
        now: float,
        step: int | None,
    ) -> None:
        slots = self._layout.rows_to_slots(ranks, nodes)
        size = len(self._layout.ranks)
        if len(self._progress) < size:
            extra = size - len(self._progress)
            self._progress = np.concatenate([self._progress, np.full(extra, now)])
            self._step = np.concatenate([self._step, np.full(extra, np.nan)])
            self._joined = np.concatenate([self._joined, np.zeros(extra, dtype=bool)])
        progressed = ~np.isnan(to_slots(step_time, slots, size))
        self._progress[progressed] = now
        self._step[progressed] = step if step is not None else np.nan
        self._joined[progressed] = False
        waiting = to_slots(joined, slots, size)
        known = ~np.isnan(waiting)
        self._joined[known] = waiting[known] > 0
        if progressed.any():
            self._fired = False

    def silence_limit(self) -> float:
        """Seconds without progress that count as a hang."""
        if not self._step_times:
            return float("inf")
        return max(self.k * statistics.median(self._step_times), self.min_silence_s)

    def poll(self, now: float) -> Sequence[Finding]:
        if self._fired or not len(self._progress):
            return ()
        last = float(self._progress.max())
        silence, limit = now - last, self.silence_limit()
        if silence < limit:
            return ()
        self._fired = True
        missing = np.flatnonzero(~self._joined)
        subject = self._culprit(missing)
        evidence = {
            "silence_s": silence,
            "limit_s": limit,
            "ranks_joined": float(self._joined.sum()),
            "ranks_missing": float(len(missing)),
        }
        finite_steps = self._step[~np.isnan(self._step)]
        if len(finite_steps):
            evidence["last_step"] = float(finite_steps.max())
        if 0 < len(missing) <= 8:
            for i, slot in enumerate(missing):
                evidence[f"missing_rank_{i}"] = float(self._layout.ranks[slot])
        step = int(evidence["last_step"]) + 1 if "last_step" in evidence else None
        return (
            Finding(
                "hang", subject, silence / limit, Severity.CRITICAL, now, step, evidence, self.name
            ),
        )

    def _culprit(self, missing: np.ndarray) -> Subject:
        """The wait-for graph's sinks: one rank, their shared node, or the whole job."""
        if len(missing) == 0 or len(missing) == len(self._joined):
            return JOB
        if len(missing) == 1:
            slot = int(missing[0])
            return Subject(
                None, int(self._layout.ranks[slot]), str(self._layout.nodes[slot]) or None
            )
        nodes = set(self._layout.nodes[missing].tolist())
        if len(nodes) == 1 and "" not in nodes:
            return Subject(None, None, str(nodes.pop()))
        return JOB
