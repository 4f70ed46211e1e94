"""Progress: a rank that stops completing steps is hung, whatever its process says.

When one rank stops, its peers stop too: they wait for it inside the next collective. The
hook reports such a wait (``in_collective``, seconds waited) while the collective is still
open, so the ranks that joined and wait are told apart from the ranks they wait for. A
waiting rank is not the culprit: it is given ``waiting_factor`` times the silence limit,
which lets the rank that never joined be found first. Only when every silent rank waits
(a collective that hangs with everyone inside, a network fault) do the waiting ones fire.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from collector.types import Frame, Subject
from detectors.types import Finding, Severity


@dataclass
class _RankState:
    last_time: float
    last_step: int | None
    started: bool
    fired: bool = False
    waiting: float = 0.0


class ProgressStall:
    """Fires ``hang`` when a rank completes no step for ``k`` times the median step time.

    The median is robust to the occasional slow step (a checkpoint, an evaluation). Before
    a rank's first step after launch, and once it reports ``closing`` (its training is over),
    ``startup_grace_s`` applies instead, since start-up (imports, process-group set-up) and
    shut-down (a last checkpoint, results) are much slower than a step. A rank leaves tracking when
    its process exits: the exit is its own finding.

    Feature contract: frames with ``step_time`` are completed steps; ``launched`` marks a
    (re)launch; ``closing`` the end of training; ``exit_code`` an exit; ``in_collective``
    > 0 a rank waiting in an open collective, 0 the end of that wait.

    >>> from collector.types import Frame, Subject
    >>> det = ProgressStall(k=2.0, min_silence_s=1.0)
    >>> for rank in (0, 1):
    ...     _ = det.process(Frame(Subject(0, rank), 5, 10.0, {"step_time": 0.1}))
    >>> _ = det.process(Frame(Subject(0, 0), 6, 10.5, {"in_collective": 0.5}))
    >>> [(f.kind, f.subject.rank) for f in det.poll(11.5)]
    [('hang', 1)]
    """

    name = "progress_stall"

    def __init__(
        self,
        k: float = 10.0,
        min_silence_s: float = 2.0,
        startup_grace_s: float = 120.0,
        window: int = 256,
        waiting_factor: float = 2.0,
    ) -> None:
        self.k = k
        self.min_silence_s = min_silence_s
        self.startup_grace_s = startup_grace_s
        self.window = window
        self.waiting_factor = waiting_factor
        self._ranks: dict[Subject, _RankState] = {}
        self._step_times: deque[float] = deque(maxlen=window)

    def process(self, frame: Frame) -> Sequence[Finding]:
        values = frame.values
        if "exit_code" in values:
            self._ranks.pop(frame.subject, None)
        elif "launched" in values:
            self._ranks[frame.subject] = _RankState(frame.time, None, started=False)
        elif "step_time" in values:
            self._step_times.append(values["step_time"])
            self._ranks[frame.subject] = _RankState(frame.time, frame.step, started=True)
        elif "closing" in values:
            last = self._ranks.get(frame.subject)
            step = frame.step if last is None else last.last_step
            self._ranks[frame.subject] = _RankState(frame.time, step, started=False)
        elif "in_collective" in values and frame.subject in self._ranks:
            self._ranks[frame.subject].waiting = values["in_collective"]
        return ()

    def silence_limit(self) -> float:
        """Seconds without a step after which a running rank counts as hung."""
        if not self._step_times:
            return self.startup_grace_s
        return max(self.k * statistics.median(self._step_times), self.min_silence_s)

    def poll(self, now: float) -> Sequence[Finding]:
        limit = self.silence_limit()
        waiting = sum(1 for state in self._ranks.values() if state.waiting > 0)
        findings = []
        for subject, state in self._ranks.items():
            allowed = limit if state.started else self.startup_grace_s
            if state.waiting > 0:
                allowed *= self.waiting_factor
            silence = now - state.last_time
            if state.fired or silence <= allowed:
                continue
            state.fired = True
            evidence = {
                "silence_s": silence,
                "limit_s": allowed,
                "waiting_in_collective": float(state.waiting > 0),
                "ranks_waiting": float(waiting),
            }
            if state.last_step is not None:
                evidence["last_step"] = float(state.last_step)
            findings.append(
                Finding(
                    "hang",
                    subject,
                    silence / allowed,
                    Severity.CRITICAL,
                    now,
                    state.last_step,
                    evidence,
                    self.name,
                )
            )
        return findings
