"""The rank processes as the progress detector sees them: /proc, every controller tick.

Launch events name each rank's process; each look at its ``/proc`` entry
(``ft_runtime.procstat``) becomes a frame: ``proc_stopped`` (state ``T``: SIGSTOP),
``proc_blocked`` (state ``D``: uninterruptible sleep) and ``proc_cpu_s`` (the CPU time of
its main thread). A rank that exits leaves; a system without /proc yields nothing.
"""

from __future__ import annotations

from collections.abc import Iterable

from collector.frames import subject_of
from collector.types import Frame, Subject
from ft_runtime import procstat
from ft_runtime.types import LifecycleEvent, Phase


class ProcessWatch:
    """Rank processes by rank id, from the supervisor's lifecycle events."""

    def __init__(self) -> None:
        self._ranks: dict[int, tuple[int, Subject]] = {}

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
            elif event.phase is Phase.EXITED:
                self._ranks.pop(rank, None)

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
