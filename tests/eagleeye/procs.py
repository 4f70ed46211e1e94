"""Whether a process of a test's job has ended, read from /proc without racing its end."""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path


def ended(pid: int) -> bool:
    """No process ``pid``, or only its zombie. One read of ``/proc/<pid>/stat``: a process
    that ends and is reaped between two looks (a signal-0 probe, then the read) would make
    the second raise instead of answering."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def outliving(pids: Iterable[int], timeout_s: float = 10.0) -> list[int]:
    """Those of ``pids`` that have not ended within ``timeout_s``. A rank whose agent was
    just killed gets its SIGKILL from the kernel (the parent-death signal) and ends a
    moment later, not at once: only one still there after the wait outlived the run."""
    waiting = list(pids)
    deadline = time.monotonic() + timeout_s
    while True:
        waiting = [pid for pid in waiting if not ended(pid)]
        if not waiting or time.monotonic() >= deadline:
            return waiting
        time.sleep(0.05)
