"""How a supervisor starts, watches, signals and stops its ranks: the ``Launcher``.

A supervisor decides what runs (which rank, which generation, which environment); a
launcher carries it out on one host and reports back. ``LocalLauncher`` runs ranks as
child processes of this machine. A launcher for another host (an agent there) implements
the same methods; nothing else of a rank crosses the interface, so a supervisor given
launchers never touches a process itself.

The interface, kept minimal on purpose:

- ``start(spec, generation, argv, env, log_path, nice)`` starts one rank; a rank already
  running under that number is replaced (the supervisor stops it first). ``env`` holds
  only the rank's own variables: the launcher adds its host's environment beneath them.
- ``exits()`` returns the exits seen since the last call, each with the exact time it was
  seen and the generation it belongs to (late exits of a replaced rank are told apart).
- ``signal(rank, sig)`` signals the rank and what it started (its process group).
- ``stop(ranks, grace_s)`` ends ranks and waits for them: SIGCONT and SIGTERM, then
  SIGKILL after ``grace_s`` (at once when 0).
- ``running(rank)``, ``pid(rank)`` and ``sample(rank)`` (state and CPU time, the evidence
  that tells a straggler from a hang) say how a rank is.

One waiter thread per local rank records the moment and status of its exit, so the first
failure of a crash cascade is known even when several ranks die within milliseconds.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ft_runtime import procstat
from ft_runtime._children import die_with_parent
from ft_runtime.errors import LaunchError
from ft_runtime.layout import RankSpec
from ft_runtime.priority import ENV_BASE_NICE
from ft_runtime.procstat import ProcSample
from ft_runtime.types import Phase

__all__ = ["Launcher", "LocalLauncher", "RankExit", "StopOnRequest"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RankExit:
    """A rank's process ended: its exit status (negative: the signal) and when it was seen."""

    rank: int
    generation: int
    code: int
    time: float


class Launcher(Protocol):
    """Starts, watches, signals and stops the ranks of one host (see the module's doc)."""

    def start(
        self,
        spec: RankSpec,
        generation: int,
        argv: Sequence[str],
        env: Mapping[str, str],
        log_path: Path,
        nice: int = 0,
    ) -> int: ...

    def exits(self) -> list[RankExit]: ...

    def signal(self, rank: int, sig: int) -> None: ...

    def stop(self, ranks: Collection[int], grace_s: float) -> None: ...

    def running(self, rank: int) -> bool: ...

    def pid(self, rank: int) -> int | None: ...

    def sample(self, rank: int) -> ProcSample | None: ...


class _Grace(Protocol):
    @property
    def stop_grace_s(self) -> float: ...


class StopOnRequest:
    """``stop(reason, grace_s)`` for a supervisor over a launcher (the job's and the
    replicas' alike): it provides ``launch.stop_grace_s``, ``phase``, ``finished``,
    ``stop_all(grace_s)`` and ``_emit(subject, phase, **detail)``."""

    launch: _Grace
    phase: Phase

    def stop(self, reason: str, grace_s: float = 0.0) -> None:
        """Ends the job on request: every rank gets SIGTERM and at least ``grace_s`` seconds
        before SIGKILL; the job is recorded as failed with ``reason``."""
        self.stop_all(max(grace_s, self.launch.stop_grace_s))
        if not self.finished:
            self.phase = Phase.FAILED
            self._emit("job", Phase.FAILED, reason=reason, stopped=True)

    @property
    def finished(self) -> bool:
        raise NotImplementedError

    def stop_all(self, grace_s: float | None = None) -> None:
        raise NotImplementedError

    def _emit(
        self, subject: str, phase: Phase, time: float | None = None, **detail: object
    ) -> None:
        raise NotImplementedError


class LocalLauncher:
    """Ranks as child processes of this machine, each leading its own session (so a
    signal reaches what it started), dying with the launcher's process.

    Args:
        clock: wall-clock time, seconds, stamped on each exit.
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        self._exits: queue.Queue[RankExit] = queue.Queue()

    def start(
        self,
        spec: RankSpec,
        generation: int,
        argv: Sequence[str],
        env: Mapping[str, str],
        log_path: Path,
        nice: int = 0,
    ) -> int:
        env = {**os.environ, **env}
        if nice:  # the level it returns to once it may (``priority.restore_priority``)
            env[ENV_BASE_NICE] = str(os.getpriority(os.PRIO_PROCESS, 0))
        try:
            with open(log_path, "wb") as out:
                process = subprocess.Popen(
                    list(argv),
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=die_with_parent(signal.SIGKILL),
                )
        except OSError as exc:
            raise LaunchError(f"cannot start rank {spec.rank}: {exc}") from exc
        if nice:
            _lower_priority(process.pid, nice)
        self._procs[spec.rank] = process
        threading.Thread(
            target=self._wait,
            args=(spec.rank, generation, process),
            daemon=True,
            name=f"wait-rank-{spec.rank}",
        ).start()
        return process.pid

    def _wait(self, rank: int, generation: int, process: subprocess.Popen[bytes]) -> None:
        code = process.wait()
        self._exits.put(RankExit(rank, generation, code, self.clock()))

    def exits(self) -> list[RankExit]:
        found = []
        while True:
            try:
                found.append(self._exits.get_nowait())
            except queue.Empty:
                return found

    def signal(self, rank: int, sig: int) -> None:
        process = self._procs.get(rank)
        if process is not None:
            _signal(process, sig)

    def stop(self, ranks: Collection[int], grace_s: float) -> None:
        chosen = [self._procs[r] for r in ranks if r in self._procs]
        live = [p for p in chosen if p.poll() is None]
        for process in live:
            _signal(process, signal.SIGCONT)
            _signal(process, signal.SIGTERM if grace_s > 0 else signal.SIGKILL)
        deadline = time.monotonic() + grace_s
        for process in live:
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal(process, signal.SIGKILL)
                process.wait()
        for process in chosen:  # what the ranks started (data loader workers)
            _signal(process, signal.SIGKILL)

    def running(self, rank: int) -> bool:
        process = self._procs.get(rank)
        return process is not None and process.poll() is None

    def pid(self, rank: int) -> int | None:
        process = self._procs.get(rank)
        return None if process is None else process.pid

    def sample(self, rank: int) -> ProcSample | None:
        pid = self.pid(rank)
        return None if pid is None else procstat.sample(pid)


def _signal(process: subprocess.Popen[bytes], sig: int) -> None:
    """Signals the rank's process group (the rank leads its own session), so what it
    started goes with it; the rank alone when the group is gone."""
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            process.send_signal(sig)
        except ProcessLookupError:
            pass


def _lower_priority(pid: int, nice: int) -> None:
    """A joiner's start-up (imports) and catch-up must not take CPU from the survivors."""
    try:
        os.setpriority(os.PRIO_PROCESS, pid, os.getpriority(os.PRIO_PROCESS, 0) + nice)
    except OSError as exc:  # it exited already, or the system refuses
        log.warning("could not lower the priority of rank pid %d: %s", pid, exc)
