"""Where every rank stands when a job hangs: its Python stacks, captured from outside.

py-spy (PyPI) reads a process's stacks from its memory without stopping or signalling
it, so it works on a stopped rank too (it needs ptrace rights: root, or
``kernel.yama.ptrace_scope`` 0 for the same user). Where it is missing or fails, the
rank's own faulthandler (armed by ``eagleeye.stackdump``) is signalled to write them to its
file; a stopped rank cannot answer that, and is reported without a stack. Every rank is
captured at once (in parallel, ``timeout_s`` in all), before remediation touches them.
Across hosts each agent captures its own ranks the same way and sends them to the
controller (``eagleeye.agents.hangstacks``), each rank's text cut to ``MAX_STACK_CHARS``
(``truncated``) and named with its host.

>>> top_frame('Thread 7 (idle): "MainThread"\\n    wait (train.py:12)\\n    <module> (train.py:30)')
'wait (train.py:12)'
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from detectors.types import Finding
from eagleeye.stackdump import STACK_SIGNAL, stack_file
from ft_runtime import procstat

#: The most characters of one rank's stacks kept (sent across hosts, stored).
MAX_STACK_CHARS = 32_000


@dataclass(frozen=True, slots=True)
class RankStack:
    """One rank's stacks: how they were read (``py-spy``, ``faulthandler`` or ``none``),
    the process state when they were (``T`` stopped, ``S`` sleeping, ...), the text, and
    the host they were read on (``""``: this machine, ``eagleeye run``)."""

    rank: int
    pid: int
    method: str
    state: str
    text: str
    host: str = ""


@dataclass(frozen=True, slots=True)
class HangStacks:
    """The stacks captured for one hang finding (the console shows them with it)."""

    finding: Finding
    stacks: tuple[RankStack, ...]

    def to_json(self) -> dict[str, object]:
        """The finding and where each rank stands (its innermost frame, or why none was
        read); the full texts are in the run store (``RunReader.stacks()``)."""
        return {
            "finding": self.finding.to_json(),
            "stacks": [
                {
                    "rank": s.rank,
                    "host": s.host,
                    "pid": s.pid,
                    "method": s.method,
                    "state": s.state,
                    "where": top_frame(s.text) if s.method != "none" else s.text,
                }
                for s in self.stacks
            ],
        }


def truncated(text: str, limit: int = MAX_STACK_CHARS) -> str:
    """``text`` cut to at most ``limit`` characters (its head: the threads first listed),
    saying so on its last line.

    >>> truncated("x" * 100, 60).splitlines()[-1]
    '[truncated: 100 characters, 23 kept]'
    >>> len(truncated("x" * 100, 60))
    60
    """
    if len(text) <= limit:
        return text
    note = f"\n[truncated: {len(text)} characters, {{kept}} kept]"
    kept = max(limit - len(note.format(kept=limit)), 0)
    return text[:kept] + note.format(kept=kept)


def find_py_spy() -> str | None:
    """The py-spy executable: on PATH, or beside this interpreter (a virtual env's bin)."""
    found = shutil.which("py-spy")
    beside = Path(sys.executable).parent / "py-spy"
    return found or (str(beside) if beside.exists() else None)


class StackCapture:
    """Captures the stacks of rank processes.

    Args:
        run_dir: the run's folder (where ranks armed faulthandler write), or None.
        py_spy: the py-spy executable; ``find_py_spy()`` by default, "" for none.
        timeout_s: the longest a capture of all ranks may take.
    """

    def __init__(
        self, run_dir: str | Path | None, py_spy: str | None = None, timeout_s: float = 5.0
    ) -> None:
        self.run_dir = run_dir
        self.py_spy = find_py_spy() if py_spy is None else (py_spy or None)
        self.timeout_s = timeout_s

    def capture(self, pids: Mapping[int, int]) -> tuple[RankStack, ...]:
        """Every rank's stacks, in rank order; a rank that cannot be read says why."""
        deadline = time.monotonic() + self.timeout_s
        states = {rank: _state(pid) for rank, pid in pids.items()}
        spied = self._py_spy(pids, deadline)
        stacks = []
        for rank, pid in sorted(pids.items()):
            if rank in spied:
                stacks.append(RankStack(rank, pid, "py-spy", states[rank], spied[rank]))
            else:
                stacks.append(self._faulthandler(rank, pid, states[rank], deadline))
        return tuple(stacks)

    def _py_spy(self, pids: Mapping[int, int], deadline: float) -> dict[int, str]:
        if self.py_spy is None:
            return {}
        running = {}
        for rank, pid in pids.items():
            command = [self.py_spy, "dump", "--nonblocking", "--pid", str(pid)]
            try:
                running[rank] = subprocess.Popen(
                    command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
                )
            except OSError:
                return {}
        out = {}
        for rank, process in running.items():
            try:
                text, _ = process.communicate(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                process.kill()
                process.communicate()
                continue
            if process.returncode == 0 and "Thread" in text:
                out[rank] = text
        return out

    def _faulthandler(self, rank: int, pid: int, state: str, deadline: float) -> RankStack:
        def none(why: str) -> RankStack:
            return RankStack(rank, pid, "none", state, why)

        if self.run_dir is None:
            return none("no stacks: py-spy unavailable and no run folder")
        path = stack_file(self.run_dir, rank)
        try:
            header = path.read_text().split("\n", 1)[0].split()
            before = path.stat().st_size
        except OSError:
            return none("no stacks: py-spy unavailable and faulthandler not armed")
        if header[:2] != ["pid", str(pid)]:
            return none("no stacks: py-spy unavailable and faulthandler not armed")
        if state == "T":
            return none("no stacks: the process is stopped and py-spy is unavailable")
        os.kill(pid, STACK_SIGNAL)
        text = _grown(path, before, deadline)
        return (
            RankStack(rank, pid, "faulthandler", state, text)
            if text
            else none("no stacks: faulthandler did not answer in time")
        )


def _grown(path: Path, before: int, deadline: float) -> str:
    """What was appended to ``path`` once it stopped growing (or the deadline passed)."""
    size = before
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = path.stat().st_size
        if now > before and now == size:
            break
        size = now
    with open(path) as handle:
        handle.seek(before)
        return handle.read()


def _state(pid: int) -> str:
    look = procstat.sample(pid)
    return "?" if look is None else look.state


def top_frame(text: str) -> str:
    """The innermost frame of the main thread (the one that runs ``<module>``) in a
    py-spy or faulthandler dump; '' when none is found."""
    blocks: list[list[str]] = []
    for line in text.splitlines():
        if line.startswith(("Thread ", "Current thread ")):
            blocks.append([])
        elif blocks and line.strip():
            blocks[-1].append(line.strip())
    main = next((b for b in blocks if any("<module>" in f for f in b)), None)
    main = main or next((b for b in blocks if b), [])
    return main[0] if main else ""
