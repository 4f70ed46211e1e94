"""Fault injection: the faults the demo, the tests and the evaluation traces inject.

A spec names a fault kind, where and when::

    kill:rank=3@step=40              SIGKILL rank 3 when it reaches step 40
    stop:rank=1@step=30              SIGSTOP it (a hang: the process lives, nothing moves)
    slow:rank=2@step=20,seconds=0.3  add 0.3 s of compute per step from step 20 (steps=N bounds it)
    slow_collective:rank=2@step=20,seconds=0.2
    nan:rank=0@step=50               the loss of that step becomes NaN
    loss_spike:rank=0@step=50,factor=20
    kill:rank=3@step=40,phase=backward   fire in the middle of backward instead of at step start
    stop:rank=1@time=20              SIGSTOP it 20 s after its attempt was launched

Kill, stop and slow at a step or a time need nothing in the script: `eagleeye run` fires
them from outside the rank (signals; slow is a SIGSTOP/SIGCONT duty cycle), at the step its
telemetry reports. A loop that calls ``ee.faults.fire(step)`` fires its own instead, at the
step's start. NaN, loss spikes, slow collectives and the other phases need that call.

Faults fire in the first attempt only unless ``attempt=N`` says otherwise, so a job restarted
from a checkpoint before the fault's step does not meet the same fault again.

>>> FaultSpec.parse("kill:rank=3@step=40")  # doctest: +NORMALIZE_WHITESPACE
FaultSpec(kind='kill', rank=3, step=40, seconds=0.0, steps=0, factor=1.0, phase='step',
          attempt=0, time=None)
"""

from __future__ import annotations

import math
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from ft_runtime.errors import FaultSpecError

KINDS = ("kill", "stop", "slow", "slow_collective", "nan", "loss_spike")
OUTSIDE_KINDS = ("kill", "stop", "slow")
"""Kinds the supervisor can fire from outside the rank (at the step phase)."""
PHASES = ("step", "backward", "collective")
EVENT_INJECTOR_ARMED = "event.injector"
"""Telemetry a rank sends when its loop fires its own faults (``ee.faults.fire``)."""
ENV_INJECT = "EAGLEEYE_INJECT"
"""Fault specs for the ranks, separated by ';'."""
_FORM = "KIND:rank=R@step=S|time=T[,seconds=X][,steps=N][,factor=F][,phase=P][,attempt=A]"


@dataclass(frozen=True, slots=True)
class FaultSpec:
    kind: str
    rank: int
    step: int
    seconds: float = 0.0
    steps: int = 0
    factor: float = 1.0
    phase: str = "step"
    attempt: int = 0
    time: float | None = None  # seconds into the attempt, instead of a step (step is -1)

    def __post_init__(self) -> None:
        for name in ("rank", "steps", "attempt") + (("step",) if self.time is None else ()):
            if getattr(self, name) < 0:
                raise FaultSpecError(f"{name} must be 0 or more, got {getattr(self, name)}")
        if self.time is not None and not (math.isfinite(self.time) and self.time >= 0):
            raise FaultSpecError(f"time must be a finite number of seconds >= 0, got {self.time}")
        for name in ("seconds", "factor"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise FaultSpecError(f"{name} must be a finite number >= 0, got {value}")
        if self.kind in ("slow", "slow_collective") and self.seconds <= 0:
            raise FaultSpecError(f"a {self.kind} fault needs seconds > 0, got {self.seconds}")

    @classmethod
    def parse(cls, text: str) -> FaultSpec:
        """Parses one spec; raises FaultSpecError naming the problem and the expected form."""
        kind, _, rest = text.strip().partition(":")
        if kind not in KINDS:
            raise FaultSpecError(
                f"unknown fault kind {kind!r} in {text!r}; kinds: {', '.join(KINDS)}; form: {_FORM}"
            )
        fields: dict[str, str] = {}
        for part in rest.replace("@", ",").split(","):
            key, sep, value = part.partition("=")
            if not sep or not key.strip():
                raise FaultSpecError(
                    f"bad fault spec {text!r}: {part!r} is not key=value; form: {_FORM}"
                )
            fields[key.strip()] = value.strip()
        if ("step" in fields) == ("time" in fields):
            raise FaultSpecError(f"fault spec {text!r} needs one of step= or time=; form: {_FORM}")
        at_time = fields.pop("time", None)
        try:
            spec = cls(
                kind=kind,
                rank=int(fields.pop("rank")),
                step=int(fields.pop("step", -1)),
                time=None if at_time is None else float(at_time),
                seconds=float(fields.pop("seconds", 0.0)),
                steps=int(fields.pop("steps", 0)),
                factor=float(fields.pop("factor", 1.0)),
                phase=fields.pop("phase", "step"),
                attempt=int(fields.pop("attempt", 0)),
            )
        except KeyError as exc:
            raise FaultSpecError(
                f"fault spec {text!r} lacks {exc.args[0]}=; form: {_FORM}"
            ) from None
        except ValueError as exc:
            raise FaultSpecError(f"bad number in fault spec {text!r}: {exc}") from None
        except FaultSpecError as exc:
            raise FaultSpecError(f"fault spec {text!r}: {exc}; form: {_FORM}") from None
        if fields:
            raise FaultSpecError(f"unknown keys {sorted(fields)} in fault spec {text!r}")
        if spec.phase not in PHASES:
            raise FaultSpecError(f"unknown phase {spec.phase!r} in {text!r}; phases: {PHASES}")
        if spec.time is not None and not spec.outside:
            raise FaultSpecError(
                f"fault spec {text!r} cannot fire at a time: only "
                f"{', '.join(OUTSIDE_KINDS)} at phase=step can; give step= instead"
            )
        return spec

    def __str__(self) -> str:
        when = f"time={self.time:g}" if self.time is not None else f"step={self.step}"
        return f"{self.kind}:rank={self.rank}@{when}"

    @property
    def outside(self) -> bool:
        """Whether the supervisor can fire it from outside the rank."""
        return self.kind in OUTSIDE_KINDS and self.phase == "step"

    def active(self, step: int) -> bool:
        """Whether the fault applies at this step (one step, or a span for slow faults);
        never for a fault at a time, which only the supervisor fires."""
        if self.time is not None:
            return False
        if self.kind in ("slow", "slow_collective"):
            return step >= self.step and (self.steps == 0 or step < self.step + self.steps)
        return step == self.step


def parse_specs(texts: Iterable[str]) -> list[FaultSpec]:
    return [FaultSpec.parse(t) for text in texts for t in text.split(";") if t.strip()]


def load_scenario(path: str | os.PathLike[str]) -> list[str]:
    """Fault specs from a scenario file: one per line; blank lines and ``#`` comments skipped.

    Raises:
        FaultSpecError: the file cannot be read, or a line is not a spec (its number given).
    """
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise FaultSpecError(f"cannot read fault scenario {path}: {exc}") from None
    except UnicodeDecodeError as exc:
        raise FaultSpecError(
            f"fault scenario {path} is not UTF-8 text (byte {exc.start}); give a text file "
            "with one spec per line"
        ) from None
    specs = []
    for number, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        try:
            FaultSpec.parse(text)
        except FaultSpecError as exc:
            raise FaultSpecError(f"{path}, line {number}: {exc}") from None
        specs.append(text)
    return specs


class FaultInjector:
    """Runs inside a rank: fires the faults aimed at it.

    Args:
        specs: all of the job's faults; the injector keeps the ones for its rank and attempt.
        rank: this process's global rank.
        attempt: the job's restart attempt.
        notify: called with a spec just before it fires (to record the injection); for
            kill and stop it must have delivered the record when it returns.
        armed: called once, at the first ``fire()``: the loop fires its own faults, so the
            supervisor leaves this rank's step faults to it.
    """

    def __init__(
        self,
        specs: Iterable[FaultSpec],
        rank: int,
        attempt: int,
        notify: Callable[[FaultSpec], None] = lambda spec: None,
        armed: Callable[[], None] = lambda: None,
    ) -> None:
        self.specs = [s for s in specs if s.rank == rank and s.attempt == attempt]
        self.notify = notify
        self._armed: Callable[[], None] | None = armed
        self._announced: set[FaultSpec] = set()

    @classmethod
    def from_env(
        cls,
        rank: int,
        attempt: int,
        notify: Callable[[FaultSpec], None] = lambda spec: None,
        armed: Callable[[], None] = lambda: None,
    ) -> FaultInjector:
        return cls(parse_specs([os.environ.get(ENV_INJECT, "")]), rank, attempt, notify, armed)

    def fire(self, step: int, phase: str = "step") -> None:
        """Applies the kill, stop and slow faults due at this step and phase."""
        if self._armed is not None:
            armed, self._armed = self._armed, None
            armed()
        for spec in self.specs:
            due_phase = "collective" if spec.kind == "slow_collective" else spec.phase
            if due_phase != phase or not spec.active(step):
                continue
            if spec.kind in ("kill", "stop"):
                self._announce(spec)
                os.kill(os.getpid(), signal.SIGKILL if spec.kind == "kill" else signal.SIGSTOP)
            elif spec.kind in ("slow", "slow_collective"):
                self._announce(spec)
                time.sleep(spec.seconds)

    def loss_multiplier(self, step: int) -> float:
        """NaN, a spike factor or 1.0: what the loss of this step is multiplied by."""
        factor = 1.0
        for spec in self.specs:
            if spec.kind == "nan" and spec.active(step):
                self._announce(spec)
                factor = math.nan
            elif spec.kind == "loss_spike" and spec.active(step):
                self._announce(spec)
                factor *= spec.factor
        return factor

    def _announce(self, spec: FaultSpec) -> None:
        if spec not in self._announced:
            self._announced.add(spec)
            self.notify(spec)
