"""Children that do not outlive the process that started them, however it dies."""

from __future__ import annotations

import ctypes
import os
import signal
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL) -> Callable[[], None]:
    """A ``preexec_fn``: the child gets ``sig`` when its parent dies (Linux's parent-death
    signal; elsewhere it does nothing). The parent is the *thread* that started the child:
    start children from a thread that lives as long as they should. A parent that died
    between the fork and the arming (the kernel would never signal it) is caught too: the
    child then sends ``sig`` to itself."""
    parent = os.getpid()  # called in the parent, when the child's command is prepared

    def arm() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, sig)
        except (OSError, AttributeError):
            return
        if os.getppid() != parent:
            os.kill(os.getpid(), sig)

    return arm
