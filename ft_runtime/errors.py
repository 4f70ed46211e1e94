"""Errors of the fault-tolerant runtime.

Retryable and terminal failures are two ordinary subclasses, so callers can tell a failure
worth another attempt from one that must stop the job.
"""

from __future__ import annotations


class FTRuntimeError(Exception):
    """Base of every error the runtime raises."""


class LaunchError(FTRuntimeError):
    """A job could not be launched as asked (bad layout, missing script, no free port)."""


class RestartBudgetExceeded(FTRuntimeError):
    """The job failed more often than its restart budget allows: terminal."""


class CheckpointError(FTRuntimeError):
    """A checkpoint could not be written or none could be read back."""


class CheckpointsUnusable(CheckpointError):
    """Checkpoints exist but none can be loaded (every one corrupt, or of another shape):
    unlike "no checkpoint", starting fresh would silently lose the run's progress."""


class FaultSpecError(FTRuntimeError):
    """A fault injection spec that cannot be parsed; the message shows the expected form."""


class CatchUpError(FTRuntimeError):
    """A recovering replica could not fetch a healthy peer's state: retryable."""


class LeftQuorum(FTRuntimeError):
    """This replica is no longer a member (isolated, or behind the others): it must restart."""
