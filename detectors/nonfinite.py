"""Non-finite numerics, named at their root: the rank whose own loss or gradient broke.

In data-parallel training one rank's NaN loss becomes every rank's NaN gradient norm after
the all-reduce, so the first rank to *report* a NaN is often not the one it came from. The
detector gathers the non-finite reports of a step until every live rank has reported that
step (or ``wait_s`` has passed), then gives one finding: about the rank whose loss, or
whose own gradient before the all-reduce (``grad_norm_local``), went non-finite, with the
ranks that only received it in its evidence. A broken own gradient names its rank before
a broken loss (a tensor-parallel group shares one loss); among equals, the earliest to
report. When no rank's own value broke, only the all-reduced gradient norm, the root
cannot be told from the reports: one rank alone is named, several give a job finding;
within ``clear_steps`` of a step whose root was found, such gradients are that root's
spread (reported a step late, as a trace may have them) and give no finding of their own.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from collector.types import JOB, Frame, Subject
from detectors.stepbatch import StepBatch
from detectors.types import Finding, Severity

#: Values that are the rank's own: non-finite here means the fault started on this rank.
OWN = ("loss", "grad_norm_local")
#: Values the all-reduce shares: non-finite here may have come from a peer.
SHARED = ("grad_norm",)
_LISTED = 8  # ranks named one by one in the evidence


@dataclass
class _Report:
    subject: Subject
    time: float
    bad: dict[str, float]


@dataclass
class _Step:
    opened: float
    reports: dict[int, _Report] = field(default_factory=dict)


class NonFiniteLoss:
    """A NaN or infinite loss or gradient norm, as one finding on its root rank.

    Args:
        wait_s: longest a step's verdict waits for ranks that have not reported it yet.
        clear_steps: steps before the same subject may be named again (a NaN that repeats
            every step is one fault, not one per step).

    >>> from collector.types import Frame, Subject
    >>> det = NonFiniteLoss()
    >>> for rank in range(3):
    ...     _ = det.process(Frame(Subject(0, rank), 6, 0.5, {"loss": 2.0, "grad_norm": 1.0}))
    >>> for rank in (1, 0, 2):  # rank 1 reports first; rank 0's own loss went NaN
    ...     loss = float("nan") if rank == 0 else 2.0
    ...     out = det.process(Frame(Subject(0, rank), 7, 1.0,
    ...                             {"loss": loss, "grad_norm": float("nan")}))
    >>> [(f.kind, str(f.subject), f.evidence["ranks_affected"]) for f in out]
    [('nan', 'rank 0', 3.0)]
    """

    name = "non_finite_loss"
    FEATURES = ("loss", "grad_norm", "grad_norm_local", "step_time", "exit_code", "launched")

    def __init__(self, wait_s: float = 2.0, clear_steps: int = 20) -> None:
        self.wait_s, self.clear_steps = wait_s, clear_steps
        self._alive: set[int] = set()
        self._reported: dict[int, int] = {}  # rank -> newest step it reported
        self._pending: dict[int, _Step] = {}
        self._done: set[int] = set()  # steps already judged (late reports are ignored)
        self._named: dict[Subject, int] = {}  # subject -> step it was last named at
        self._first_step: int | None = None  # before a whole step was seen, who is alive is unknown
        self._rooted: int | None = None  # the step a rank's own value was last found broken

    def process(self, frame: Frame) -> Sequence[Finding]:
        rank, step = frame.subject.rank, frame.step
        if rank is None:
            return self._judge_single(frame)
        if "exit_code" in frame.values:
            self._alive.discard(rank)
            self._reported.pop(rank, None)
            return self._complete(frame.time)
        self._alive.add(rank)
        if step is None:
            return ()
        if self._first_step is None:
            self._first_step = step
        self._reported[rank] = max(step, self._reported.get(rank, step))
        bad = _bad(frame.values)
        if bad and step not in self._done:
            pending = self._pending.setdefault(step, _Step(frame.time))
            pending.reports[rank] = _Report(frame.subject, frame.time, bad)
        return self._complete(frame.time)

    def process_step(self, batch: StepBatch) -> Sequence[Finding]:
        """A whole step at once: every rank has reported, so the verdict is immediate."""
        rows = np.zeros(len(batch.ranks), dtype=bool)
        for feature in (*OWN, *SHARED):
            rows |= batch.reported(feature) & ~np.isfinite(batch.column(feature))
        if not rows.any():
            return ()
        pending = _Step(batch.time)
        for row in np.flatnonzero(rows):
            values = {f: float(batch.column(f)[row]) for f in (*OWN, *SHARED)}
            reported = {f: v for f, v in values.items() if batch.reported(f)[row]}
            report = _Report(batch.subject(int(row)), batch.time, _bad(reported))
            pending.reports[int(batch.ranks[row])] = report
        return self._verdict(batch.step, pending, batch.time)

    def poll(self, now: float) -> Sequence[Finding]:
        late = [s for s, p in self._pending.items() if now - p.opened >= self.wait_s]
        return [f for s in sorted(late) for f in self._verdict(s, self._pending.pop(s), now)]

    def flush(self) -> Sequence[Finding]:
        """End of the stream: every step still waiting is judged on what it has."""
        return self.poll(math.inf)

    def _complete(self, now: float) -> list[Finding]:
        """Judges the steps every live rank has reported (or moved past)."""
        out: list[Finding] = []
        for step in sorted(self._pending):
            known = self._first_step is not None and step > self._first_step
            if known and all(self._reported.get(r, -1) >= step for r in self._alive):
                out += self._verdict(step, self._pending.pop(step), now)
        return out

    def _verdict(self, step: int, pending: _Step, now: float) -> list[Finding]:
        self._done.add(step)
        if len(self._done) > 1024:
            self._done = {s for s in self._done if s > step - 512}
        broken = {r: p for r, p in pending.reports.items() if p.bad}
        if not broken:
            return []
        own = {r: p for r, p in broken.items() if any(k in p.bad for k in OWN)}
        if own:
            # A broken gradient before the all-reduce is one rank's own; a loss may be
            # shared (a tensor-parallel group computes one loss on every rank of it).
            root = min(
                own.values(),
                key=lambda p: ("grad_norm_local" not in p.bad, p.time, p.subject.rank),
            )
            subject = root.subject
            self._rooted = step
        elif self._rooted is not None and 0 <= step - self._rooted < self.clear_steps:
            return []  # the gradients a rank's own NaN spread to, a step or more later
        elif len(broken) == 1:
            root = next(iter(broken.values()))
            subject = root.subject
        else:
            root = min(broken.values(), key=lambda p: (p.time, p.subject.rank))
            subject = JOB
        last = self._named.get(subject)
        if last is not None and 0 <= step - last < self.clear_steps:
            return []
        self._named[subject] = step
        evidence = self._evidence(root, own, broken, subject)
        return [
            Finding("nan", subject, 1.0, Severity.CRITICAL, root.time, step, evidence, self.name)
        ]

    def _evidence(
        self,
        root: _Report,
        own: Mapping[int, _Report],
        broken: Mapping[int, _Report],
        subject: Subject,
    ) -> dict[str, float]:
        evidence = dict(root.bad) if subject.rank is not None else {}
        evidence["ranks_affected"] = float(len(broken))
        evidence["ranks_nonfinite_own"] = float(len(own))
        if subject.rank is None:
            evidence["root_unknown"] = 1.0
        others = sorted(r for r in broken if r != subject.rank)
        for i, rank in enumerate(others[:_LISTED]):
            evidence[f"affected_rank_{i}"] = float(rank)
        return evidence

    def _judge_single(self, frame: Frame) -> Sequence[Finding]:
        """A frame without a rank (a job's or node's series): judged on its own."""
        bad = _bad(frame.values)
        if not bad:
            return ()
        return (
            Finding(
                "nan", frame.subject, 1.0, Severity.CRITICAL, frame.time, frame.step, bad, self.name
            ),
        )


def _bad(values: Mapping[str, float]) -> dict[str, float]:
    return {
        k: float(values[k]) for k in (*OWN, *SHARED) if k in values and not math.isfinite(values[k])
    }
