"""The rank's side of stack capture: faulthandler, armed for the controller's signal.

The controller reads a hung job's stacks with py-spy when it can (as root, from outside,
even from a stopped process). Its fallback is the rank's own faulthandler: each rank
registers ``STACK_SIGNAL`` to write every thread's Python stack into its own file in the
run's ``stacks/`` folder. The file's first line names the process (``pid N``), so the
controller signals only a process that armed the handler (an unarmed one would die of
it). A signal that someone else already handles is left alone.
"""

from __future__ import annotations

import faulthandler
import os
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import IO

from eagleeye.config import ENV_RUN_DIR

STACK_SIGNAL = signal.SIGUSR2
_ARMED: list[IO[str]] = []  # the open file faulthandler writes to (it must stay open)


def stack_file(run_dir: str | Path, rank: int) -> Path:
    """Where rank ``rank`` writes its stacks."""
    return Path(run_dir) / "stacks" / f"rank-{rank}.txt"


def enable_stack_dumps(env: Mapping[str, str], rank: int, attempt: int) -> bool:
    """Arms faulthandler on ``STACK_SIGNAL`` for this process, once; False when there is
    no run folder or the signal is taken."""
    run_dir = env.get(ENV_RUN_DIR)
    if _ARMED or not run_dir or signal.getsignal(STACK_SIGNAL) is not signal.SIG_DFL:
        return bool(_ARMED)
    path = stack_file(run_dir, rank)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path, "w")  # noqa: SIM115 - faulthandler writes to it until exit
        handle.write(f"pid {os.getpid()} attempt {attempt}\n")
        handle.flush()
        faulthandler.register(STACK_SIGNAL, file=handle, all_threads=True, chain=False)
    except (OSError, RuntimeError, ValueError):
        return False
    _ARMED.append(handle)
    return True
