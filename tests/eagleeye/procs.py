"""Whether a process of a test's job has ended, read from /proc without racing its end."""

from __future__ import annotations

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
