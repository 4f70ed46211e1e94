"""Per-thread CPU priority, so that background work of a rank yields to its training loop.

On Linux a nice value belongs to a thread, not to the whole process:
``os.setpriority(os.PRIO_PROCESS, tid, value)`` with a thread id changes that one thread.
The catch-up server runs its threads (HTTP serving, serialisation, checksums) a few nice
levels below the thread that trains, so the scheduler gives the training thread the CPU
first; hashing and socket I/O release the GIL, so the lowered threads rarely hold it while
waiting for a CPU.

>>> base = thread_nice()
>>> lower_this_thread(base) == base  # the same level is always allowed
True
"""

from __future__ import annotations

import logging
import os
import threading

log = logging.getLogger(__name__)

ENV_BASE_NICE = "EAGLEEYE_BASE_NICE"
"""Niceness a rank launched at a lowered priority returns to (``restore_priority``)."""
NICE_MAX = 19
"""The lowest priority Linux gives a thread."""


def process_thread_ids() -> list[int]:
    """The native ids of this process's threads (``/proc/self/task``); where there is no
    /proc, only the calling thread's."""
    try:
        return [int(name) for name in os.listdir("/proc/self/task")]
    except OSError:
        return [threading.get_native_id()]


def thread_nice(native_id: int | None = None) -> int:
    """The nice value of a thread (the calling one by default)."""
    tid = threading.get_native_id() if native_id is None else native_id
    return os.getpriority(os.PRIO_PROCESS, tid)


def lower_this_thread(target: int, warn: bool = True) -> int | None:
    """Sets the calling thread's nice value to ``target`` (clamped to 19).

    Returns the nice value it runs at, or None when the system refused (for example a
    raise of the priority without the privilege for it): the thread then goes on at the
    priority it had, and the refusal is logged (when ``warn``), never raised.
    """
    target = min(target, NICE_MAX)
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), target)
    except OSError as exc:
        if not warn:
            return None
        log.warning(
            "thread %s stays at nice %d: could not set nice %d (%s)",
            threading.current_thread().name,
            thread_nice(),
            target,
            exc,
        )
        return None
    return thread_nice()


def restore_priority() -> None:
    """Called by a joining rank once caught up: every thread of the process goes back to
    the priority the rank was launched with (``ENV_BASE_NICE``). A nice value belongs to
    a thread, and threads started while the rank ran lowered (torch's, the hook's) inherit
    the lowered value, so each is restored, not only the caller. Raising a priority may
    need privileges; without them the rank stays lower and says so."""
    base = os.environ.get(ENV_BASE_NICE)
    if base is None:
        return
    for tid in process_thread_ids():
        try:
            os.setpriority(os.PRIO_PROCESS, tid, int(base))
        except ProcessLookupError:
            continue  # the thread ended meanwhile
        except OSError as exc:
            log.warning("joined at a lowered priority; could not restore it: %s", exc)
            return
