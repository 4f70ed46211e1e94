"""What a failed rank said, and when restarting it again is pointless.

A rank's error is read from torchrun's error file (``TORCHELASTIC_ERROR_FILE``, written by
``torch.distributed.elastic.multiprocessing.errors.record``) when the script wrote one,
else from the last traceback in its log. A crash loop is the same failure of the rank's
own making (exit code, step and last error line) at the start of two attempts in a row:
the job stops restarting and says why. A rank killed from outside never makes a loop.
"""

from __future__ import annotations

import json
import signal
from dataclasses import dataclass
from pathlib import Path

TAIL_BYTES = 64 * 1024
EXTERNAL_SIGNALS = frozenset(
    -s for s in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
)
"""Exit codes of a rank ended from outside: the same one twice is no crash loop."""
MAX_LINES = 40


@dataclass(frozen=True, slots=True)
class RankFailure:
    """The first failure of an attempt: who, how, where, and what it said."""

    rank: int
    attempt: int
    exit_code: int
    step: int | None
    error: str  # the traceback or the log's last lines; may be empty
    log_path: str

    @property
    def last_line(self) -> str:
        lines = [line for line in self.error.splitlines() if line.strip()]
        return lines[-1].strip() if lines else ""

    def same_as(self, other: RankFailure) -> bool:
        """The same exit code, step and error line (any rank: every rank of a job with a
        bad setting fails alike, and whichever is first differs from run to run)."""
        return (self.exit_code, self.step, self.last_line) == (
            other.exit_code,
            other.step,
            other.last_line,
        )


def rank_error(log_dir: Path, rank: int) -> str:
    """The rank's traceback: from its error file, else from the end of its log."""
    from_file = _error_file(log_dir / f"error-rank-{rank}.json")
    return from_file or _log_traceback(log_dir / f"rank-{rank}.log")


class CrashLoop:
    """Remembers each attempt's first failure; a repeat of the last one is a loop."""

    def __init__(self) -> None:
        self._last: RankFailure | None = None
        self._attempt = -1

    def first_of_attempt(self, attempt: int) -> bool:
        """Whether no failure of ``attempt`` was noted yet."""
        return attempt != self._attempt

    def note(self, failure: RankFailure) -> str | None:
        """Notes the first failure of an attempt; returns why restarting is pointless when it
        repeats the previous attempt's, else None."""
        previous, self._last, self._attempt = self._last, failure, failure.attempt
        if failure.exit_code in EXTERNAL_SIGNALS:
            return None  # killed from outside (an operator, a scheduler, a fault): no loop
        if previous is None or previous.attempt != failure.attempt - 1:
            return None
        if not failure.same_as(previous):
            return None
        where = "before its first step" if failure.step is None else f"at step {failure.step}"
        said = f": {failure.last_line}" if failure.last_line else ""
        return (
            f"crash loop: rank {failure.rank} failed with exit code {failure.exit_code} "
            f"{where} in attempts {previous.attempt} and {failure.attempt}{said}; "
            "restarting again would fail the same way"
        )


def _error_file(path: Path) -> str:
    try:
        data = json.loads(path.read_text(errors="replace")[: TAIL_BYTES * 4])
        message = data["message"]
        if isinstance(message, dict):
            extra = message.get("extraInfo", {})
            text = extra.get("py_callstack") or message.get("message", "")
        else:
            text = str(message)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return ""
    return _last_lines(str(text))


def _log_traceback(path: Path) -> str:
    try:
        with open(path, "rb") as log:
            log.seek(0, 2)
            size = log.tell()
            log.seek(max(0, size - TAIL_BYTES))
            text = log.read().decode(errors="replace")
    except OSError:
        return ""
    start = text.rfind("Traceback (most recent call last)")
    return _last_lines(text[start:] if start >= 0 else text)


def _last_lines(text: str) -> str:
    lines = text.rstrip().splitlines()
    return "\n".join(lines[-MAX_LINES:])
