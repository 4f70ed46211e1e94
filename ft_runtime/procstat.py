"""Whether a local process is running: the evidence that tells a straggler from a hang.

A rank that is late into an exchange because the machine is busy is runnable (state
``R``) or gets CPU time between two looks; a stopped rank (SIGSTOP: state ``T``) or one
blocked for good gets none. Linux's ``/proc`` says both; elsewhere nothing is known
(``None``) and callers go by the heartbeats alone. A job-control stop (``T``) is evidence
by itself (``stopped``): nothing a healthy rank does puts it there. A tracing stop (``t``:
a debugger or a stack reader holds it) is not; it passes.

>>> import os
>>> sample(os.getpid()).state  # the process asking is running
'R'
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

HAS_PROC = Path("/proc/self/stat").exists()


@dataclass(frozen=True, slots=True)
class ProcSample:
    """One look at a process's main thread."""

    state: str  # R running, S sleeping, D disk wait, T stopped, Z zombie, ...
    cpu_ns: int  # time its main thread has run on a CPU, nanoseconds


def sample(pid: int) -> ProcSample | None:
    """The state and CPU time of ``pid``'s main thread; None when /proc cannot tell."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        schedstat = Path(f"/proc/{pid}/schedstat").read_text()
    except OSError:
        return None
    # "pid (comm) state ...": comm may hold spaces and parentheses, the state follows the last ")".
    fields = stat[stat.rfind(")") + 2 :].split()
    try:
        return ProcSample(fields[0], int(schedstat.split()[0]))
    except (IndexError, ValueError):
        return None


def running(before: ProcSample | None, now: ProcSample | None) -> bool:
    """Whether a process is running, not stopped or blocked: runnable now, or it got CPU
    time since ``before``. False when unknown."""
    if now is None:
        return False
    if now.state == "R":
        return True
    return before is not None and now.cpu_ns > before.cpu_ns and now.state not in "TtZX"


def stopped(now: ProcSample | None) -> bool:
    """Whether a process is stopped by a signal (SIGSTOP, SIGTSTP): state ``T``. A tracing
    stop (``t``) is not counted: a debugger or a stack reader holds it only for a moment."""
    return now is not None and now.state == "T"


def exited(now: ProcSample | None) -> bool:
    """Whether a process has ended: a zombie not yet reaped, or gone from /proc (on a
    system that has /proc)."""
    if now is None:
        return HAS_PROC
    return now.state in "ZX"
