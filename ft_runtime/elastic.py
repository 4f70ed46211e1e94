"""The workers of torchrun's elastic agent, seen from inside its process: a ``Supervisor``.

Under stock ``torchrun`` the elastic agent starts, stops and restarts the ranks; Eagle
Eye's rendezvous backend runs in the agent's process and watches them. ``ElasticWorkers``
is what its controller drives: it finds the agent's workers among this process's
children (their environment names the rendezvous run), reports each as launched, and
reads each exit status the moment the worker ends without reaping it (``waitid`` with
``WNOWAIT``: the agent still reaps its own children and sees the same status).

What it can do to the job is what the agent allows from a rendezvous backend: ask for a
new rendezvous round (``restart_requested``: the backend then reports a waiting node, and
every host's agent stops its workers and starts them again, a restart that torchrun does
not count against ``--max-restarts``). A restart answering a worker's failure is left to
the agent, which restarts on failures by itself within its budget; the outcome says so.
Other actions (isolating a replica, a checkpoint command) need Eagle Eye's own launcher
and are refused with that reason.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil

from ft_runtime.base import answer_before_acting
from ft_runtime.layout import ENV_RESUME_FROM
from ft_runtime.types import Action, LifecycleEvent, Outcome, OutcomeStatus, Phase

__all__ = ["ElasticWorkers"]


@dataclass
class _Worker:
    rank: int
    pid: int
    round: int
    node: str
    exit_code: int | None = None
    exited_at: float | None = None
    status_known: bool = True


class ElasticWorkers:
    """The current round's workers of the elastic agent running in this process.

    Args:
        run_id: the rendezvous run id (``TORCHELASTIC_RUN_ID`` of the workers).
        clock: wall-clock time, seconds.
        collateral_window_s: failures this soon after a round's first are its collateral.
    """

    def __init__(
        self,
        run_id: str,
        clock: Callable[[], float] = time.time,
        collateral_window_s: float = 10.0,
    ) -> None:
        self.run_id = run_id
        self.clock = clock
        self.collateral_window_s = collateral_window_s
        self.attempt = -1
        self.phase = Phase.LAUNCH
        self.attempt_env: Callable[[int], Mapping[str, str]] = lambda attempt: {}
        self.node = "node0"
        self._lock = threading.Lock()
        self._workers: dict[int, _Worker] = {}  # pid → worker, this round's
        self._events: list[LifecycleEvent] = []
        self._first_failure: float | None = None
        self._restart_requested = False
        self._restart_reason: str | None = None
        self._no_restart: str | None = None
        self._done_keys: set[str] = set()
        self._others: set[int] = set()  # children that are no worker of the run
        self._waiters: list[threading.Thread] = []
        self._ended = False

    # ---- what the rendezvous backend tells it ---------------------------------------------
    def begin_round(self, node: str) -> dict[str, str]:
        """A new rendezvous round: the agent starts this round's workers next. Returns the
        variables its workers are to get (``attempt_env``: the checkpoint to resume from)."""
        with self._lock:
            if self._restart_requested or self.attempt >= 0:
                why = self._restart_reason or "torchrun's agent began a new round"
                self._emit("job", Phase.RECOVERING, reason=why)
            self._restart_reason = None
            self.attempt += 1
            self.node = node
            self._workers = {}
            self._first_failure = None
            self._restart_requested = False
            self.phase = Phase.RUNNING
            extra = dict(self.attempt_env(self.attempt))
            self._emit(
                "job",
                Phase.LAUNCH,
                node=node,
                launcher="torchrun",
                resume_from=extra.get(ENV_RESUME_FROM, ""),
            )
            return extra

    @property
    def restart_requested(self) -> bool:
        """Whether a restart of every host's workers was asked for and has not begun."""
        return self._restart_requested

    def end(self) -> None:
        """The agent is done (its rendezvous is shut down): the job's result follows from
        the last round's exits."""
        self._poll_children()
        for waiter in self._waiters:
            waiter.join(timeout=2.0)  # the agent has ended its workers: their exits are in
        with self._lock:
            workers = list(self._workers.values())
            # a worker whose status the agent took first counts as 0 (see _exit_status)
            succeeded = bool(workers) and all(w.exit_code == 0 for w in workers)
            self.phase = Phase.SUCCEEDED if succeeded else Phase.FAILED
            self._ended = True
            if succeeded:
                self._emit("job", Phase.SUCCEEDED)
            else:
                failed = sorted(w.rank for w in workers if w.exit_code != 0)
                self._emit("job", Phase.FAILED, reason=self._why_failed(failed))

    def _why_failed(self, failed: list[int]) -> str:
        if not self._workers:
            return "torchrun's agent ended with no worker started"
        return f"torchrun's agent ended: ranks {failed} of the last round did not exit 0"

    # ---- Supervisor -----------------------------------------------------------------------
    def start(self) -> None:
        """Nothing to start: the elastic agent starts its workers."""

    def poll(self) -> list[LifecycleEvent]:
        self._poll_children()
        return self._take()

    def settle(self) -> list[LifecycleEvent]:
        return self._take()

    def outcomes(self) -> list[Outcome]:
        return []

    def look_now(self) -> bool:
        return False

    def execute(self, action: Action) -> Outcome:
        unsupported = (
            f"{action.kind.value} needs `eagleeye run` or `eagleeye agent`; under torchrun "
            "only restarts of the worker group are possible"
        )
        answer = answer_before_acting(action, self._done_keys, self.clock(), unsupported)
        if answer is not None:
            return answer
        if self.finished:
            return self._outcome(action, OutcomeStatus.SKIPPED, f"job already {self.phase.value}")
        self._done_keys.add(action.key)
        if self._no_restart is not None:
            return self._outcome(action, OutcomeStatus.SKIPPED, self._no_restart)
        if self._first_failure is not None:
            return self._outcome(
                action,
                OutcomeStatus.DONE,
                "torchrun's agent restarts the worker group itself after a failure "
                "(within its --max-restarts)",
            )
        if self._restart_requested:
            return self._outcome(
                action, OutcomeStatus.SKIPPED, "a new rendezvous round is already asked for"
            )
        self.continue_stopped()
        self._restart_requested = True
        self._restart_reason = action.reason
        self.phase = Phase.RECOVERING
        return self._outcome(
            action,
            OutcomeStatus.DONE,
            "asked torchrun's agents for a new rendezvous round: every host restarts its workers",
        )

    def stop(self, reason: str, grace_s: float = 0.0) -> None:
        """A stop is torchrun's (it handles SIGTERM and SIGINT itself): nothing to do."""

    def stop_all(self, grace_s: float | None = None) -> None:
        """The agent ends its own workers."""

    def stop_restarting(self, reason: str) -> None:
        self._no_restart = reason

    def log_path(self, rank: int) -> Path | None:
        return None  # torchrun's --log-dir and --redirects decide where output goes

    def alive(self) -> int:
        return sum(1 for w in list(self._workers.values()) if w.exit_code is None)

    def pids(self) -> dict[int, int]:
        return {w.rank: w.pid for w in list(self._workers.values()) if w.exit_code is None}

    @property
    def finished(self) -> bool:
        return self._ended

    # ---- the workers ----------------------------------------------------------------------
    def _poll_children(self) -> None:
        """New workers of this round (launch events) and ended ones (exit events)."""
        if self.attempt < 0:
            return
        for child in _children():
            if child.pid in self._workers or child.pid in self._others:
                continue
            found = _worker_of(child, self.run_id)
            if found is None:
                if _age_s(child) > 2.0:  # a younger one may not have exec'd its command yet
                    self._others.add(child.pid)
                continue
            rank, restarts = found
            with self._lock:
                if child.pid in self._workers:
                    continue
                worker = _Worker(rank, child.pid, self.attempt, self.node)
                self._workers[child.pid] = worker
                # the attempt its telemetry is labelled with: torchrun's restart count
                self._emit(
                    f"rank:{rank}",
                    Phase.LAUNCH,
                    node=self.node,
                    replica=0,
                    pid=child.pid,
                    attempt=restarts,
                )
            waiter = threading.Thread(
                target=self._await_exit, args=(worker,), name=f"exit-of-rank-{rank}", daemon=True
            )
            waiter.start()
            self._waiters.append(waiter)

    def _await_exit(self, worker: _Worker) -> None:
        """Waits for the worker's end and reads its status, leaving it for the agent."""
        code, known = _exit_status(worker.pid)
        with self._lock:
            worker.exit_code, worker.exited_at, worker.status_known = code, self.clock(), known
            if worker.round != self.attempt:
                return
            expected = self._restart_requested or self.phase is Phase.RECOVERING
            collateral = code != 0 and (
                expected
                or (
                    self._first_failure is not None
                    and worker.exited_at - self._first_failure <= self.collateral_window_s
                )
            )
            if code != 0 and self._first_failure is None and not expected:
                self._first_failure = worker.exited_at
            detail: dict[str, object] = {}
            if not known:
                detail["status_unknown"] = True  # reaped by the agent before it was read
            self._emit(
                f"rank:{worker.rank}",
                Phase.EXITED,
                time=worker.exited_at,
                exit_code=code,
                collateral=collateral,
                node=worker.node,
                replica=0,
                **detail,
            )

    def continue_stopped(self) -> None:
        """A stopped worker gets SIGCONT so that the agent's SIGTERM can end it (before a
        new round, whichever host asked for it)."""
        for worker in list(self._workers.values()):
            if worker.exit_code is None:
                try:
                    os.kill(worker.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass

    def _emit(
        self, subject: str, phase: Phase, time: float | None = None, **detail: object
    ) -> None:
        when = self.clock() if time is None else time
        self._events.append(LifecycleEvent(subject, phase, when, self.attempt, detail))

    def _take(self) -> list[LifecycleEvent]:
        with self._lock:
            events, self._events = self._events, []
        return events

    def _outcome(self, action: Action, status: OutcomeStatus, detail: str) -> Outcome:
        return Outcome(action, status, detail, self.clock())


def _children() -> list[psutil.Process]:
    try:
        return psutil.Process().children()
    except psutil.Error:
        return []


def _age_s(process: psutil.Process) -> float:
    try:
        return time.time() - process.create_time()
    except psutil.Error:
        return 0.0


def _worker_of(child: psutil.Process, run_id: str) -> tuple[int, int] | None:
    """(rank, torchrun's restart count) of a child that is a worker of the run, else None."""
    try:
        env = child.environ()
    except psutil.Error:
        return None
    if env.get("TORCHELASTIC_RUN_ID") != run_id or "RANK" not in env:
        return None
    try:
        return int(env["RANK"]), int(env.get("TORCHELASTIC_RESTART_COUNT", "0"))
    except ValueError:
        return None


def _exit_status(pid: int) -> tuple[int, bool]:
    """The child's exit code (negative: the signal), read without reaping it; (0, False)
    when the agent reaped it first and its status can no longer be read: not judged a
    failure here (the agent restarts a failed group by itself)."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    except ChildProcessError:
        return 0, False
    except InterruptedError:  # pragma: no cover - retried by Python since PEP 475
        return _exit_status(pid)
    if info is None:  # pragma: no cover - only with WNOHANG
        return 0, False
    if info.si_code == os.CLD_EXITED:
        return info.si_status, True
    return -info.si_status, True
