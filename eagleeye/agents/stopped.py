"""A stopped rank across hosts: seen by its host's agent, judged by the controller.

On its host, the agent looks at each live rank's ``/proc`` entry every tick
(``StopLooks``): a rank in state ``T`` (SIGSTOP, SIGTSTP) at two looks in a row is
stopped, and the agent forwards a ``proc_stopped`` sample (1), repeated each second while
the stop lasts, and a 0 when the rank runs again or ends. A tracing stop (``t``, a
debugger) is not a stop.

The controller (``StoppedRankHang``) holds a stopped rank hung only on evidence that the
job waits for it: the rank has been stopped for ``k`` median step times (at least
``floor_s``) and, over the same time, no step of the job completed (the others wait for
it in the collective it never entered). Then one critical ``hang`` on the stopped rank,
the number of ranks waiting in its evidence; its host's agent ends it with the rest of the
attempt when the policy restarts the job. A job stopped whole (every rank) is suspended,
not hung; a job that reports no step telemetry gives no evidence that anyone waits: its
stopped rank is a warning (``rank_stopped``) and nothing acts on it. Times are the
controller's: a sample counts from when it arrives, not from the host's clock.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable, Mapping

from collector.types import Frame, Sample, Subject
from detectors.types import Finding, Severity
from ft_runtime import procstat

STOPPED = "proc_stopped"
#: While a rank stays stopped, its agent repeats the sample this often (the evidence).
REPEAT_S = 1.0


class StopLooks:
    """The agent's looks at its ranks' processes: ``proc_stopped`` samples on a change."""

    def __init__(self) -> None:
        self._seen_t: set[int] = set()  # ranks in state T at the previous look
        self._stopped: dict[int, tuple[float, int]] = {}  # rank → last told, its attempt

    def look(self, ranks: Mapping[int, tuple[int, int]], node: str, now: float) -> list[Sample]:
        """``ranks``: the live ranks' processes on ``node``: rank → (pid, its attempt)."""
        out: list[Sample] = []
        for rank in [r for r in self._stopped if r not in ranks]:  # ended while stopped
            out.append(self._sample(rank, 0.0, self._stopped.pop(rank)[1], node, now))
        in_t = {r for r, (pid, _) in ranks.items() if procstat.stopped(procstat.sample(pid))}
        for rank, (_, attempt) in sorted(ranks.items()):
            told = self._stopped.get(rank)
            if rank in in_t and rank in self._seen_t:
                if told is None or now - told[0] >= REPEAT_S:
                    self._stopped[rank] = (now, attempt)
                    out.append(self._sample(rank, 1.0, attempt, node, now))
            elif rank not in in_t and told is not None:
                del self._stopped[rank]
                out.append(self._sample(rank, 0.0, attempt, node, now))
        self._seen_t = in_t
        return out

    @staticmethod
    def _sample(rank: int, value: float, attempt: int, node: str, now: float) -> Sample:
        labels = {"rank": str(rank), "node": node, "attempt": str(attempt)}
        return Sample(STOPPED, value, now, labels)


class StoppedRankHang:
    """The controller's judgement of the stopped ranks its agents report (one attempt).

    Args:
        world_size: the job's ranks (a stop of all of them is a suspended job).
        k: how many median step times the rank must stay stopped and the job still.
        floor_s: a floor on that time, for very short steps.
    """

    name = "stopped_rank"

    def __init__(self, world_size: int, k: float = 3.0, floor_s: float = 1.0) -> None:
        self.world_size, self.k, self.floor_s = world_size, k, floor_s
        self._since: dict[int, tuple[float, Subject]] = {}  # rank → stopped since, subject
        self._step_times: deque[float] = deque(maxlen=32)
        self._progress: float | None = None  # when the job's newest step arrived
        self._newest: int | None = None
        self._told: set[int] = set()  # ranks already the subject of a finding

    def observe(self, samples: Iterable[Sample], attempt: int, now: float) -> None:
        """The agents' ``proc_stopped`` samples, as they arrive (those of other attempts
        than ``attempt`` are of processes that are gone)."""
        for sample in samples:
            rank = sample.labels.get("rank", "")
            if sample.name != STOPPED or not rank.isdigit():
                continue
            if sample.labels.get("attempt") != str(attempt):
                continue
            if sample.value > 0:
                subject = Subject(rank=int(rank), node=sample.labels.get("node") or None)
                self._since.setdefault(int(rank), (now, subject))
            else:
                self._since.pop(int(rank), None)

    def job_step(self, frame: Frame, now: float) -> None:
        """The job's frame of a step (the hosts' summaries reduced): progress."""
        if frame.step is None or (self._newest is not None and frame.step <= self._newest):
            return
        self._newest, self._progress = frame.step, now
        step_time = frame.values.get("step_time.median")
        if step_time is not None and step_time > 0:
            self._step_times.append(step_time)

    def limit_s(self) -> float:
        """How long a rank must stay stopped, and the job still, to be hung."""
        if not self._step_times:
            return self.floor_s
        return max(self.k * statistics.median(self._step_times), self.floor_s)

    def poll(self, now: float) -> list[Finding]:
        if not self._since or len(self._since) >= self.world_size:
            return []
        limit = self.limit_s()
        found = []
        waiting = float(self.world_size - len(self._since))
        for rank, (since, subject) in sorted(self._since.items()):
            if rank in self._told or now - since < limit:
                continue
            evidence = {f"stopped_rank_{rank}": 1.0, "stopped_s": now - since, "limit_s": limit}
            if self._progress is None:  # no step telemetry: nobody is seen waiting
                self._told.add(rank)
                warning = self._finding("rank_stopped", subject, Severity.WARN, now, evidence)
                found.append(warning)
                continue
            still = now - max(self._progress, since)
            if still < limit:
                continue  # the job went on stepping since the stop: nobody waits for it
            self._told.add(rank)
            evidence |= {"job_still_s": still, "ranks_waiting": waiting}
            found.append(self._finding("hang", subject, Severity.CRITICAL, now, evidence))
        return found

    def _finding(
        self, kind: str, subject: Subject, level: Severity, now: float, evidence: dict[str, float]
    ) -> Finding:
        step = None if self._newest is None else self._newest + 1
        return Finding(kind, subject, 1.0, level, now, step, evidence, self.name)


__all__ = ["REPEAT_S", "STOPPED", "StopLooks", "StoppedRankHang"]
