"""Hung collectives: who never joined, who joined and waits.

Every rank reports when it completes a step (``step_time``) and whether it is waiting
inside the current collective (``in_collective``, from per-rank collective enter/exit
events or a flight-recorder dump). When no rank has progressed for ``k`` times the median
step time, the ranks that never entered the collective are the ones the others wait for:
the wait-for graph's sinks. The finding names them (one rank, their node, or the job).

PyTorch's flight-recorder dumps say the same more surely: the collector's
``flight_record_events`` turns the dumps of all ranks into ``nccl_pending_collective``
(this rank waits in a collective) and ``nccl_rank_behind`` (this rank never entered the
collective its peers are in; value = its sequence number). Frames carrying them name the
ranks directly; ranks named behind by the dumps are the culprits, whatever else reported.

A look at a rank's process that shows it stopped (``proc_stopped`` 1, as a run's
controller records them) names that rank directly too, once it has stayed stopped for
``stopped_k`` median step times (at least ``stopped_s``), whatever the silence: the
evidence the live progress detector judges on, replayed from a recorded run.

Silence alone is weak evidence: every rank is silent through a long checkpoint or
evaluation too. While no rank is seen waiting in a collective (no ``in_collective`` 1, no
dump), the silence must also outlast ``quiet_factor`` times the longest step the job has
taken (a checkpoint step is one); with ranks waiting, ``k`` median steps suffice.

In a live job, lifecycle frames keep it honest: a rank that exits (``exit_code``) leaves
the wait-for graph (its death is a finding of its own), and a (re)launched rank
(``launched``) gets ``startup_grace_s`` to reach its first step, so a restart in progress
is not taken for a hang.
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

#: Features of flight-recorder events (see collector.nccl_hang).
FR_BEHIND = "nccl_rank_behind"
FR_PENDING = "nccl_pending_collective"
#: A look at a rank's process that showed it stopped (1), or running again (0).
STOPPED = "proc_stopped"


class CollectiveHang:
    """Fires ``hang`` on a stalled job, localised to the ranks that never joined.

    Args:
        k: silence, in median step times, that counts as a hang.
        min_silence_s: a floor on that silence, for very short steps.
        window: steps of step-time history for the median.
        startup_grace_s: silence allowed while a launched rank has not stepped yet.
        stopped_k: median step times a rank reported stopped must stay so.
        stopped_s: a floor on that.
        quiet_factor: with no rank seen waiting in a collective, the silence must also
            outlast this many times the job's longest step.

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

    def __init__(
        self,
        k: float = 2.0,
        min_silence_s: float = 0.5,
        window: int = 64,
        startup_grace_s: float = 120.0,
        stopped_k: float = 2.0,
        stopped_s: float = 0.25,
        quiet_factor: float = 2.0,
    ) -> None:
        self.k, self.min_silence_s, self.window = k, min_silence_s, window
        self.quiet_factor = quiet_factor
        self._longest = 0.0  # the job's longest step so far (s)
        self.startup_grace_s = startup_grace_s
        self.stopped_k, self.stopped_s = stopped_k, stopped_s
        self._stopped = np.zeros(0)  # since when a look showed the rank stopped (nan: not)
        self._layout = RankLayout()
        self._progress = np.zeros(0)
        self._step = np.zeros(0)
        self._joined = np.zeros(0, dtype=bool)
        self._alive = np.zeros(0, dtype=bool)
        self._starting = np.zeros(0, dtype=bool)
        self._behind = np.zeros(0)  # sequence number a dump says the rank never entered
        self._step_times: deque[float] = deque(maxlen=window)
        self._fired = False

    def process(self, frame: Frame) -> Sequence[Finding]:
        if frame.subject.rank is None:
            return ()
        ranks = np.array([frame.subject.rank])
        nodes = np.array([frame.subject.node or ""], dtype=object)
        replicas = np.array([frame.subject.replica or 0])
        if frame.values.keys() & {"exit_code", "launched", "closing"}:
            self._lifecycle(ranks, nodes, replicas, frame)
            return ()
        if FR_BEHIND in frame.values or FR_PENDING in frame.values:
            self._flight_record(ranks, nodes, replicas, frame)
            return ()
        step_time = frame.values.get("step_time", np.nan)
        joined = frame.values.get("in_collective", np.nan)
        self._update(
            ranks,
            nodes,
            np.array([step_time]),
            np.array([joined]),
            frame.time,
            frame.step,
            replicas,
            np.array([frame.values.get(STOPPED, np.nan)]),
        )
        if not np.isnan(step_time):
            self._step_times.append(float(step_time))
            self._longest = max(self._longest, float(step_time))
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
            batch.replicas,
            batch.column(STOPPED) if STOPPED in batch.features else None,
        )
        exited, launched = batch.reported("exit_code"), batch.reported("launched")
        if exited.any() or launched.any():  # as in ``process``: exits leave, launches start
            slots = self._layout.rows_to_slots(batch.ranks, batch.nodes, batch.replicas)
            for mask, alive in ((exited, False), (launched, True)):
                rows = np.flatnonzero(mask)
                chosen = rows if slots is None else slots[rows]
                self._alive[chosen] = alive
                self._starting[chosen] = alive
                if alive:
                    self._progress[chosen] = batch.time
        typical = job_value(batch, "step_time")
        if typical is not None:
            self._step_times.append(typical)
            self._longest = max(self._longest, typical)
        return self.poll(batch.time)

    def _update(
        self,
        ranks: np.ndarray,
        nodes: np.ndarray,
        step_time: np.ndarray,
        joined: np.ndarray,
        now: float,
        step: int | None,
        replicas: np.ndarray | None = None,
        stopped: np.ndarray | None = None,
    ) -> None:
        slots = self._slots(ranks, nodes, replicas, now)
        size = len(self._layout.ranks)
        if stopped is not None:
            looks = to_slots(stopped, slots, size)
            seen = looks > 0
            self._stopped[seen & np.isnan(self._stopped)] = now
            self._stopped[looks == 0] = np.nan
        stepped = ~np.isnan(to_slots(step_time, slots, size))
        # Every rank stepped (the usual step): whole arrays are set, no mask is applied.
        progressed: np.ndarray | slice = slice(None) if stepped.all() else stepped
        self._stopped[progressed] = np.nan
        self._progress[progressed] = now
        self._step[progressed] = step if step is not None else np.nan
        self._joined[progressed] = False
        self._alive[progressed] = True
        self._starting[progressed] = False
        self._behind[progressed] = np.nan
        waiting = to_slots(joined, slots, size)
        known = ~np.isnan(waiting)
        if known.all():
            self._joined[:] = waiting > 0
        else:
            self._joined[known] = waiting[known] > 0
        if stepped.any():
            self._fired = False

    def _slots(
        self, ranks: np.ndarray, nodes: np.ndarray, replicas: np.ndarray | None, now: float
    ) -> np.ndarray | None:
        slots = self._layout.rows_to_slots(ranks, nodes, replicas)
        extra = len(self._layout.ranks) - len(self._progress)
        if extra > 0:
            self._progress = np.concatenate([self._progress, np.full(extra, now)])
            self._step = np.concatenate([self._step, np.full(extra, np.nan)])
            self._joined = np.concatenate([self._joined, np.zeros(extra, dtype=bool)])
            self._alive = np.concatenate([self._alive, np.ones(extra, dtype=bool)])
            self._starting = np.concatenate([self._starting, np.zeros(extra, dtype=bool)])
            self._behind = np.concatenate([self._behind, np.full(extra, np.nan)])
            self._stopped = np.concatenate([self._stopped, np.full(extra, np.nan)])
        return slots

    def _flight_record(
        self, ranks: np.ndarray, nodes: np.ndarray, replicas: np.ndarray, frame: Frame
    ) -> None:
        """A dump's word on one rank: it waits in a collective, or it never entered one."""
        slots = self._slots(ranks, nodes, replicas, frame.time)
        slot = 0 if slots is None else int(slots[0])
        if FR_BEHIND in frame.values:
            self._behind[slot] = frame.values[FR_BEHIND]
            self._joined[slot] = False
        elif np.isnan(self._behind[slot]):
            self._joined[slot] = True

    def _lifecycle(
        self, ranks: np.ndarray, nodes: np.ndarray, replicas: np.ndarray, frame: Frame
    ) -> None:
        """An exit takes the rank out of the graph; a launch starts its grace period, and so
        does the end of training (``closing``): shutting down is slower than a step."""
        slots = self._slots(ranks, nodes, replicas, frame.time)
        slot = 0 if slots is None else int(slots[0])
        launched = "launched" in frame.values or "closing" in frame.values
        self._alive[slot] = launched
        self._starting[slot] = launched
        self._joined[slot] = False
        if launched:
            self._progress[slot] = frame.time

    def silence_limit(self) -> float:
        """Seconds without progress that count as a hang."""
        if not self._step_times:
            return float("inf")
        return max(self.k * statistics.median(self._step_times), self.min_silence_s)

    def stopped_limit(self) -> float:
        """Seconds a rank reported stopped must stay so."""
        if not self._step_times:
            return self.stopped_s
        return max(self.stopped_k * statistics.median(self._step_times), self.stopped_s)

    def poll(self, now: float) -> Sequence[Finding]:
        if self._fired or not self._alive.any():
            return ()
        stopped = self._stopped_ranks(now)
        if stopped is not None:
            return (stopped,)
        last = float(self._progress[self._alive].max())
        limit = self.silence_limit()
        if self._starting[self._alive].any():
            limit = max(limit, self.startup_grace_s)
        behind = ~np.isnan(self._behind) & self._alive
        waited_on = behind.any() or (self._joined & self._alive).any()
        if not waited_on:  # nobody seen waiting: perhaps a long checkpoint, not a hang
            limit = max(limit, self.quiet_factor * self._longest)
        silence = now - last
        if silence < limit:
            return ()
        self._fired = True
        missing = np.flatnonzero(behind if behind.any() else ~self._joined & self._alive)
        subject = self._culprit(missing)
        evidence = {
            "silence_s": silence,
            "limit_s": limit,
            "ranks_joined": float((self._joined & self._alive).sum()),
            "ranks_missing": float(len(missing)),
        }
        if not waited_on:
            evidence["longest_step_s"] = self._longest
        if behind.any():  # the flight recorder named them
            evidence["flight_recorder"] = 1.0
            evidence["never_entered_seq"] = float(np.nanmin(self._behind[behind]))
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

    def _stopped_ranks(self, now: float) -> Finding | None:
        """The ranks looks showed stopped for long enough, while others were not (a job
        stopped whole is suspended, not hung)."""
        stopped = ~np.isnan(self._stopped) & self._alive
        if not stopped.any() or stopped.sum() == self._alive.sum():
            return None
        held, limit = now - float(np.nanmin(self._stopped[stopped])), self.stopped_limit()
        if held < limit:
            return None
        self._fired = True
        slots = np.flatnonzero(stopped)
        waiting = np.flatnonzero(self._joined & self._alive & ~stopped)
        evidence = {"stopped": 1.0, "stopped_s": held, "limit_s": limit}
        evidence["ranks_waiting"] = float(len(waiting))
        for name, chosen in (("culprit_rank", slots), ("waiting_rank", waiting)):
            for i, slot in enumerate(chosen[:8]):
                evidence[f"{name}_{i}"] = float(self._layout.ranks[slot])
        steps = self._step[slots]
        step = int(np.nanmax(steps)) + 1 if (~np.isnan(steps)).any() else None
        subject = self._culprit(slots)
        return Finding(
            "hang", subject, held / limit, Severity.CRITICAL, now, step, evidence, self.name
        )

    def _culprit(self, missing: np.ndarray) -> Subject:
        """The wait-for graph's sinks: one rank, their shared node, or the whole job."""
        if len(missing) == 0 or len(missing) == int(self._alive.sum()):
            return JOB
        lay = self._layout
        if len(missing) == 1:
            slot = int(missing[0])
            node = str(lay.nodes[slot]) or None
            return Subject(int(lay.replicas[slot]), int(lay.ranks[slot]), node)
        nodes = set(self._layout.nodes[missing].tolist())
        if len(nodes) == 1 and "" not in nodes:
            return Subject(None, None, str(nodes.pop()))
        return JOB
