"""The rank processes as the progress detector sees them: /proc, every controller tick.

Launch events name each rank's process; each look at its ``/proc`` entry
(``ft_runtime.procstat``) becomes a frame: ``proc_stopped`` (state ``T``: SIGSTOP),
``proc_blocked`` (state ``D``: uninterruptible sleep) and ``proc_cpu_s`` (the CPU time of
its main thread). A rank that exits leaves; a system without /proc yields nothing.

While a rank is stopped, each look is also kept as a ``proc_stopped`` sample (1; a 0 when
it runs again), at most ``keep`` per stop, so a recorded run carries the evidence its
hang was judged on (``eagleeye.recorded`` exports them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from collector.frames import subject_of
from collector.types import Frame, Sample, Subject
from ft_runtime import procstat
from ft_runtime.types import LifecycleEvent, Phase


class ProcessWatch:
    """Rank processes by rank id, from the supervisor's lifecycle events."""

    def __init__(self, keep: int = 200) -> None:
        self._ranks: dict[int, tuple[int, Subject]] = {}
        self._stopped: dict[int, int] = {}  # rank → looks kept in its current stop
        self._attempt: dict[int, int] = {}
        self.keep = keep

    def note(self, events: Iterable[LifecycleEvent]) -> None:
        for event in events:
            if not event.subject.startswith("rank:"):
                continue
            rank = int(event.subject.removeprefix("rank:"))
            if event.phase is Phase.LAUNCH and "pid" in event.detail:
                labels = {
                    "rank": str(rank),
                    "replica": str(event.detail.get("replica", "")),
                    "node": str(event.detail.get("node", "")),
                }
                subject = subject_of({k: v for k, v in labels.items() if v})
                self._ranks[rank] = (int(event.detail["pid"]), subject)
                self._attempt[rank] = int(event.detail.get("attempt", event.attempt))
            elif event.phase is Phase.EXITED:
                self._ranks.pop(rank, None)
                self._stopped.pop(rank, None)

    def pids(self) -> dict[int, int]:
        """The live rank processes: rank id → pid."""
        return {rank: pid for rank, (pid, _) in self._ranks.items()}

    def frames(self, now: float) -> list[Frame]:
        """One frame per rank whose /proc entry could be read."""
        frames = []
        for pid, subject in self._ranks.values():
            look = procstat.sample(pid)
            if look is None:
                continue
            values = {
                "proc_stopped": float(look.state == "T"),
                "proc_blocked": float(look.state == "D"),
                "proc_cpu_s": look.cpu_ns / 1e9,
            }
            frames.append(Frame(subject, None, now, values))
        return frames

    def stopped_samples(
        self, frames: list[Frame], step_of: Callable[[int], int | None]
    ) -> list[Sample]:
        """``proc_stopped`` samples of these looks, on the step each rank was in: each look
        at a stopped rank (up to ``keep`` per stop) and the first after it runs again."""
        out = []
        for frame in frames:
            rank = frame.subject.rank
            if rank is None:
                continue
            stopped = frame.values["proc_stopped"] > 0
            kept = self._stopped.get(rank)
            if stopped and (kept or 0) < self.keep:
                self._stopped[rank] = (kept or 0) + 1
            elif not stopped and kept is not None:
                del self._stopped[rank]
            else:
                continue
            labels = {"rank": str(rank), "attempt": str(self._attempt.get(rank, 0))}
            if frame.subject.replica is not None:
                labels["replica"] = str(frame.subject.replica)
            if frame.subject.node is not None:
                labels["node"] = frame.subject.node
            sample = Sample("proc_stopped", float(stopped), frame.time, labels, step_of(rank))
            out.append(sample)
        return out
