"""Per-step frames of whole nodes and replicas, built from their ranks' frames.

A node's (or replica's) frame for a step is emitted as soon as every rank known to belong
to it has reported that step, or ``wait_s`` after the first of them did, whichever comes
first: a missing or late rank never holds a frame back for ever, and shows up as
``ranks_missing`` in it. Features are combined as mean and max (``step_time.mean``,
``step_time.max``), which is what a peer comparison across nodes needs.

>>> from collector.types import Frame, Subject
>>> agg = StepAggregator(wait_s=1.0)
>>> for rank in (0, 1):
...     agg.expect(Subject(replica=0, rank=rank, node="n0"))
>>> _ = agg.add(Frame(Subject(replica=0, rank=0, node="n0"), 0, 0.0, {"t": 1.0}))
>>> [(f.subject.scope, f.values["t.max"]) for f in
...  agg.add(Frame(Subject(replica=0, rank=1, node="n0"), 0, 0.1, {"t": 3.0}))]
[('node', 3.0), ('replica', 3.0)]
>>> _ = agg.add(Frame(Subject(replica=0, rank=0, node="n0"), 1, 5.0, {"t": 1.0}))
>>> [(f.subject.scope, f.step, f.values["ranks_missing"]) for f in agg.flush(now=6.5)]
[('node', 1, 1.0), ('replica', 1, 1.0)]
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from collector.types import Frame, Subject


@dataclass
class _Pending:
    first_seen: float
    frames: dict[int, Frame] = field(default_factory=dict)


class StepAggregator:
    """Combines rank frames into node and replica frames, step by step.

    Args:
        wait_s: longest a group's step waits for its slowest rank.
        max_pending: steps per group kept waiting; older ones are flushed early.
    """

    def __init__(self, wait_s: float = 5.0, max_pending: int = 64) -> None:
        self.wait_s = wait_s
        self.max_pending = max_pending
        self._members: dict[Subject, set[int]] = defaultdict(set)
        self._pending: dict[tuple[Subject, int], _Pending] = {}

    def expect(self, subject: Subject) -> None:
        """Registers a rank (from its launch) as a member of its node and replica."""
        if subject.rank is not None:
            for group in _groups(subject):
                self._members[group].add(subject.rank)

    def add(self, frame: Frame) -> list[Frame]:
        """Takes one rank frame; returns the group frames it completes."""
        subject, step = frame.subject, frame.step
        if subject.rank is None or step is None:
            return []
        self.expect(subject)
        done = []
        for group in _groups(subject):
            pending = self._pending.setdefault((group, step), _Pending(frame.time))
            pending.frames[subject.rank] = frame
            if len(pending.frames) >= len(self._members[group]):
                done.append(self._emit(group, step))
        return done + self._trim()

    def flush(self, now: float) -> list[Frame]:
        """Emits the group steps that have waited ``wait_s`` or longer."""
        expired = [key for key, p in self._pending.items() if now - p.first_seen >= self.wait_s]
        return [self._emit(group, step) for group, step in sorted(expired, key=_order)]

    def _trim(self) -> list[Frame]:
        if len(self._pending) <= self.max_pending * max(1, len(self._members)):
            return []
        oldest = sorted(self._pending, key=lambda key: self._pending[key].first_seen)
        excess = len(self._pending) - self.max_pending * len(self._members)
        return [self._emit(group, step) for group, step in oldest[:excess]]

    def _emit(self, group: Subject, step: int) -> Frame:
        pending = self._pending.pop((group, step))
        frames = list(pending.frames.values())
        values = _combine(f.values for f in frames)
        values["ranks_reporting"] = float(len(frames))
        values["ranks_missing"] = float(len(self._members[group]) - len(frames))
        return Frame(group, step, max(f.time for f in frames), values)


def _groups(subject: Subject) -> list[Subject]:
    groups = []
    if subject.node is not None:
        groups.append(Subject(replica=None, rank=None, node=subject.node))
    if subject.replica is not None:
        groups.append(Subject(replica=subject.replica))
    return groups


def _combine(rows: Iterable[Mapping[str, float]]) -> dict[str, float]:
    sums: dict[str, float] = defaultdict(float)
    maxima: dict[str, float] = {}
    counts: dict[str, int] = defaultdict(int)
    for values in rows:
        for name, value in values.items():
            sums[name] += value
            counts[name] += 1
            maxima[name] = max(maxima.get(name, value), value)
    combined = {f"{name}.mean": sums[name] / counts[name] for name in sums}
    combined.update({f"{name}.max": value for name, value in maxima.items()})
    return combined


def _order(key: tuple[Subject, int]) -> tuple[int, str]:
    group, step = key
    return step, group.scope
