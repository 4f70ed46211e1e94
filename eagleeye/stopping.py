"""Stopping a job on request (SIGTERM, SIGINT) without losing its work.

With a grace period, the supervisor first asks the loops that listen for it to checkpoint
(a request file in the run folder, read by ``RankSession.checkpoint_requested()``), waits
for their checkpoints, then sends SIGTERM to every rank (stopped ranks continued first),
so a script's own SIGTERM handler can save too, and SIGKILL to whatever is left when the
grace period ends.

The request names a step a little ahead of the newest one reported (about 1.5 s of
training), and a loop is asked at that step, not when it happens to see the file: ranks
that train in lockstep must leave their loop at the same step, or one waits forever in a
collective that the others have left.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from eagleeye.config import ENV_RUN_DIR

REQUEST = Path("control") / "checkpoint-request"
EVENT_LISTENING = "event.stop_listener"
"""Telemetry a rank sends the first time its loop asks whether a checkpoint is requested."""


LEAD_S = 1.5
"""How far ahead (in training time) of the newest reported step the checkpoint is asked:
the request reaches every rank's loop through its host's agent and a look at the file
every 0.2 s, and a rank that reads it only past the step saves at a step of its own."""


def request_checkpoint(run_dir: Path, cause: str, at_step: int | None = None) -> None:
    """Asks the listening loops for a checkpoint at ``at_step`` (at once when None)."""
    path = run_dir / REQUEST
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".tmp")  # a rank never reads half a request
    partial.write_text(json.dumps({"time": time.time(), "cause": cause, "step": at_step}))
    partial.replace(path)


def request_step(
    newest: int | None, step_time_s: float | None, lead_s: float = LEAD_S
) -> int | None:
    """The step to ask for: ``lead_s`` of training after ``newest`` (at least 3 steps), so
    every rank has read the request before it gets there; None when no step is known."""
    if newest is None:
        return None
    if step_time_s is None or not math.isfinite(step_time_s) or step_time_s <= 0:
        return newest + 3
    return newest + max(3, min(100_000, math.ceil(lead_s / step_time_s)))


PACE_STEPS = 8
"""How many step times a stop that came early waits for before it names a step: the
first steps alone (warm-up: 14 ms, then 0.5 ms a step) measure the lead in steps a
tenth too short, and the ranks pass the step before the request reaches them."""


def pace_known(step_times: Iterable[float]) -> bool:
    """Whether enough step times are known to measure the lead in (``PACE_STEPS``)."""
    return len(_usable(step_times)) >= PACE_STEPS


def typical_step_s(step_times: Iterable[float]) -> float | None:
    """The step time to measure the lead in: the lower quartile of the recent ones. The
    first steps (warm-up) and the slow ones of a loaded host lengthen a median, and a lead
    counted in steps too long falls short of the time the request needs to arrive."""
    times = sorted(_usable(step_times))
    return times[len(times) // 4] if times else None


def _usable(step_times: Iterable[float]) -> list[float]:
    """The step times that say something: finite and above 0."""
    return [t for t in step_times if math.isfinite(t) and t > 0]


class CheckpointRequest:
    """The rank's side: whether the supervisor asks for a checkpoint at this step (a stat
    at most every ``every_s`` seconds, so a loop can ask at every step)."""

    def __init__(self, env: Mapping[str, str] | None = None, every_s: float = 0.2) -> None:
        env = os.environ if env is None else env
        run_dir = env.get(ENV_RUN_DIR)
        self.path = None if not run_dir else Path(run_dir) / REQUEST
        self.every_s = every_s
        self._checked = -math.inf
        self._seen = False
        self._at_step: int | None = None

    def requested(self, step: int | None = None) -> bool:
        """Whether to checkpoint now, the loop being at ``step`` (None: not known)."""
        if not self._seen and self.path is not None:
            now = time.monotonic()
            if now - self._checked >= self.every_s:
                self._checked = now
                self._seen, self._at_step = _read(self.path)
        if not self._seen:
            return False
        return self._at_step is None or step is None or step >= self._at_step


def _read(path: Path) -> tuple[bool, int | None]:
    """(present, step asked for) of a request file; one that cannot be read asks at once."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return False, None
    except OSError:
        return True, None
    try:
        step = json.loads(text).get("step")
    except (ValueError, AttributeError):
        return True, None
    return True, step if isinstance(step, int) and not isinstance(step, bool) else None
