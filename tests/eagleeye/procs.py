"""Whether a process of a test's job has ended, read from /proc without racing its end."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path

from ft_runtime import procstat

# A rank that exits 1 on SIGUSR1, as a rank whose peer vanished mid-collective fails. It
# prints ARMED once its handler is in place: a signal sent before would kill it with -10.
FAILS_ON_SIGUSR1 = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGUSR1, lambda *_: sys.exit(1))\n"
    "print('armed', flush=True)\n"
    "while True: time.sleep(0.05)\n"
)


def armed(log: Path, timeout_s: float = 60.0) -> None:
    """Wait until the rank writing ``log`` says its SIGUSR1 handler is in place."""
    deadline = time.monotonic() + timeout_s
    while not (log.exists() and "armed" in log.read_text(errors="replace")):
        assert time.monotonic() < deadline, f"{log} never said it was armed"
        time.sleep(0.02)


def stop(pid: int, timeout_s: float = 10.0) -> None:
    """SIGSTOPs ``pid`` and waits until /proc shows it stopped: the signal lands only when
    the process is next scheduled, which on a busy machine is not at once."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout_s
    while not procstat.stopped(procstat.sample(pid)):
        assert time.monotonic() < deadline, f"process {pid} never stopped"
        time.sleep(0.01)


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


def is_rank(cmdline: str) -> bool:
    """A rank's command line: the interpreter, then the zero-code boot."""
    return cmdline.split()[1:3] == ["-m", "eagleeye.boot"]


def naming(folder: Path) -> dict[int, str]:
    """Live processes (not zombies) whose command line or environment names ``folder``,
    each with its command line."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            environ = (entry / "environ").read_bytes().decode(errors="replace")
            state = (entry / "stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        named = str(folder) in cmdline or str(folder) in environ  # a rank: its run folder
        if named and state not in ("Z", "X"):
            found[int(entry.name)] = cmdline
    return found


def left_naming(folder: Path, timeout_s: float = 20.0) -> dict[int, str]:
    """The processes that still name ``folder`` after waiting up to ``timeout_s`` for
    none to (a killed process's children get their signal asynchronously)."""
    deadline = time.monotonic() + timeout_s
    while naming(folder) and time.monotonic() < deadline:
        time.sleep(0.1)
    return naming(folder)


def parent(pid: int) -> int:
    """The parent's pid (-1: the process is gone)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
    except (OSError, IndexError, ValueError):
        return -1
