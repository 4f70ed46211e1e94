"""Stopping a job on request (SIGTERM, SIGINT) without losing its work.

With a grace period, the supervisor first asks the loops that listen for it to checkpoint
(a request file in the run folder, read by ``RankSession.checkpoint_requested()``), waits
for their checkpoints, then sends SIGTERM to every rank (stopped ranks continued first),
so a script's own SIGTERM handler can save too, and SIGKILL to whatever is left when the
grace period ends.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path

from eagleeye.config import ENV_RUN_DIR

REQUEST = Path("control") / "checkpoint-request"
EVENT_LISTENING = "event.stop_listener"
"""Telemetry a rank sends the first time its loop asks whether a checkpoint is requested."""


def request_checkpoint(run_dir: Path, cause: str) -> None:
    path = run_dir / REQUEST
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{time.time():.3f} {cause}\n")


class CheckpointRequest:
    """The rank's side: whether the supervisor asks for a checkpoint (a stat at most every
    ``every_s`` seconds, so a loop can ask at every step)."""

    def __init__(self, env: Mapping[str, str] | None = None, every_s: float = 0.2) -> None:
        env = os.environ if env is None else env
        run_dir = env.get(ENV_RUN_DIR)
        self.path = None if not run_dir else Path(run_dir) / REQUEST
        self.every_s = every_s
        self._checked = 0.0
        self._requested = False

    def requested(self) -> bool:
        if self._requested or self.path is None:
            return self._requested
        now = time.monotonic()
        if now - self._checked >= self.every_s:
            self._checked = now
            self._requested = self.path.exists()
        return self._requested
