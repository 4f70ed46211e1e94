"""Launches a job's ranks through a launcher and supervises them through restarts.

The launcher (``ft_runtime.launcher``; by default ``LocalLauncher``, this machine) records
the exact moment and status of each exit, so the first failure of a crash cascade is known
even when several ranks die within milliseconds (a SIGKILLed rank's ring neighbours fail on
"connection reset" right after it). Exits after the first failure of an attempt are marked
``collateral``.

Recovery here is the synchronous baseline: every rank is stopped and the whole job starts
again from its last checkpoint, as torchrun does. It stays available behind a flag as the
yardstick for replica-level recovery.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ft_runtime.base import answer_before_acting
from ft_runtime.errors import LaunchError
from ft_runtime.launcher import Launcher, LocalLauncher, StopOnRequest
from ft_runtime.layout import ENV_RESUME_FROM, JobLayout, RankSpec
from ft_runtime.ports import free_port
from ft_runtime.types import Action, LifecycleEvent, Outcome, OutcomeStatus, Phase


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """What to run and how: the command (without the interpreter), layout, environment."""

    command: Sequence[str]
    layout: JobLayout
    run_id: str
    log_dir: str
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    env: Mapping[str, str] = field(default_factory=dict)
    python: str = ""
    collateral_window_s: float = 10.0
    stop_grace_s: float = 3.0
    resume_args: Sequence[str] = ()  # appended to the command from the second attempt on


@dataclass
class _Rank:
    spec: RankSpec
    attempt: int
    log_path: Path | None = None
    expected_stop: bool = False


class JobSupervisor(StopOnRequest):
    """Owns the rank processes of one job. Not thread-safe: drive it from one thread.

    Args:
        launch: what to start.
        max_restarts: restart budget; the restart after the last one allowed fails the job.
        clock: wall-clock time, seconds.
        launcher: starts and stops the ranks (default: on this machine).
    """

    launch: LaunchSpec

    def __init__(
        self,
        launch: LaunchSpec,
        max_restarts: int = 3,
        clock: Callable[[], float] = time.time,
        launcher: Launcher | None = None,
    ) -> None:
        self.launch = launch
        self.launcher: Launcher = LocalLauncher(clock) if launcher is None else launcher
        self.max_restarts = max_restarts
        self.clock = clock
        self.attempt = -1
        self.restarts = 0
        self.phase = Phase.LAUNCH
        self._ranks: dict[int, _Rank] = {}
        self._events: list[LifecycleEvent] = []
        self._first_failure: float | None = None
        self._done_keys: set[str] = set()
        self._restart_requested = False
        self._exited: set[int] = set()
        self._no_restart: str | None = None
        # Variables of an attempt that only the caller knows (the checkpoint to resume from).
        self.attempt_env: Callable[[int], Mapping[str, str]] = lambda attempt: {}

    # ---- lifecycle --------------------------------------------------------------------
    def start(self) -> None:
        """Launches the next attempt; its LAUNCH events come with the next ``poll()``."""
        self.attempt += 1
        self._first_failure = None
        self._restart_requested = False
        self._exited = set()
        port = self.launch.master_port or free_port(self.launch.master_addr)
        log_dir = Path(self.launch.log_dir) / f"attempt-{self.attempt}"
        log_dir.mkdir(parents=True, exist_ok=True)
        extra = dict(self.attempt_env(self.attempt))
        self._emit(
            "job",
            Phase.LAUNCH,
            world_size=self.launch.layout.world_size,
            master_port=port,
            # what a restart resumes from, for the record: a checkpoint, the script's flags
            resume_from=extra.get(ENV_RESUME_FROM, ""),
            resume_args=" ".join(self.command()[len(self.launch.command) :]),
        )
        for spec in self.launch.layout.ranks():
            env = {
                **self.launch.env,
                **self.launch.layout.environment(
                    spec, self.launch.master_addr, port, self.attempt, self.launch.run_id
                ),
                **self._elastic_env(log_dir, spec.rank),
                **extra,
            }
            log_path = log_dir / f"rank-{spec.rank}.log"
            try:
                pid = self.launcher.start(spec, self.attempt, self._argv(), env, log_path)
            except LaunchError as exc:  # half an attempt would wait for the rest forever
                self._abandon_attempt(f"attempt {self.attempt} could not start: {exc}")
                raise
            self._ranks[spec.rank] = _Rank(spec, self.attempt, log_path)
            self._emit(
                f"rank:{spec.rank}", Phase.LAUNCH, node=spec.node, replica=spec.replica, pid=pid
            )
        self.phase = Phase.RUNNING

    def _abandon_attempt(self, reason: str) -> None:
        """Ends the ranks of an attempt that could not start whole; the job has failed."""
        started = [r for r, rank in self._ranks.items() if rank.attempt == self.attempt]
        for rank in started:
            self._ranks[rank].expected_stop = True
        self.launcher.stop(started, self.launch.stop_grace_s)
        self.phase = Phase.FAILED
        self._emit("job", Phase.FAILED, reason=reason)

    def _elastic_env(self, log_dir: Path, rank: int) -> dict[str, str]:
        """torchrun's variables that depend on the supervisor: the restart budget and the
        error file a rank's ``@record`` writes its traceback to."""
        return {
            "TORCHELASTIC_MAX_RESTARTS": str(self.max_restarts),
            "TORCHELASTIC_ERROR_FILE": str((log_dir / f"error-rank-{rank}.json").resolve()),
        }

    def command(self) -> list[str]:
        """The ranks' command line of the current attempt (the resume flags on restarts)."""
        resume = list(self.launch.resume_args) if self.attempt > 0 else []
        return [*self.launch.command, *resume]

    def stop_restarting(self, reason: str) -> None:
        """From now on a restart fails the job with ``reason`` (a crash loop, a stop)."""
        self._no_restart = reason

    def _argv(self) -> list[str]:
        return [self.launch.python or _python(), *self.command()]

    def poll(self) -> list[LifecycleEvent]:
        """Collects exits since the last call and updates the job's phase."""
        for ended in self.launcher.exits():
            rank = self._ranks.get(ended.rank)
            if ended.generation != self.attempt or rank is None or rank.expected_stop:
                continue
            self._exited.add(ended.rank)
            self._record_exit(rank, ended.code, ended.time)
        everyone_done = len(self._exited) == self.launch.layout.world_size
        if self.phase is Phase.RUNNING and everyone_done and not self._failed():
            self.phase = Phase.SUCCEEDED
            self._emit("job", Phase.SUCCEEDED)
        return self._take_events()

    def _record_exit(self, rank: _Rank, code: int, when: float) -> None:
        collateral = (
            code != 0
            and self._first_failure is not None
            and when - self._first_failure <= self.launch.collateral_window_s
        )
        if code != 0 and self._first_failure is None:
            self._first_failure = when
        self._emit(
            f"rank:{rank.spec.rank}",
            Phase.EXITED,
            time=when,
            exit_code=code,
            collateral=collateral,
            node=rank.spec.node,
            replica=rank.spec.replica,
        )

    def settle(self) -> list[LifecycleEvent]:
        """Fails the job if a rank failed and no restart was asked for; returns events."""
        if self.phase is Phase.RUNNING and self._failed() and not self._restart_requested:
            self.stop_all()
            self.phase = Phase.FAILED
            self._emit("job", Phase.FAILED, reason="a rank failed and no recovery was run")
        return self._take_events()

    def restart_job(self, reason: str) -> bool:
        """Stops every rank and starts the next attempt; False if the budget is spent,
        in which case the job has failed. A refusal (a spent budget, a crash loop) fails
        the job with its reason."""
        refusal = self.restart_refusal()
        if refusal is not None:
            self.stop_all()
            self.phase = Phase.FAILED
            self._emit("job", Phase.FAILED, reason=refusal)
            return False
        self._restart_requested = True
        self.phase = Phase.RECOVERING
        self._emit("job", Phase.RECOVERING, reason=reason)
        self.stop_all()
        self.restarts += 1
        self.start()
        return True

    def stop_all(self, grace_s: float | None = None) -> None:
        """Stops every live rank and the processes it started: SIGCONT (for stopped ones)
        and SIGTERM, then SIGKILL after ``grace_s`` (default: the launch's)."""
        grace_s = self.launch.stop_grace_s if grace_s is None else grace_s
        for rank in self._ranks.values():
            rank.expected_stop = True
        self.launcher.stop(list(self._ranks), grace_s)

    # ---- the control protocol ------------------------------------------------------------
    def execute(self, action: Action) -> Outcome:
        """Runtime protocol. This supervisor restarts jobs; other kinds are not supported."""
        unsupported = f"{action.kind.value} is not supported by synchronous recovery"
        answer = answer_before_acting(action, self._done_keys, self.clock(), unsupported)
        if answer is not None:
            return answer
        if self.phase in (Phase.SUCCEEDED, Phase.FAILED):
            return self._outcome(action, OutcomeStatus.SKIPPED, f"job already {self.phase.value}")
        self._done_keys.add(action.key)
        refusal = self.restart_refusal()
        try:
            restarted = self.restart_job(action.reason)
        except LaunchError as exc:
            why = f"attempt {self.attempt} could not start: {exc}; job failed"
            return self._outcome(action, OutcomeStatus.FAILED, why)
        if not restarted:
            return self._outcome(action, OutcomeStatus.FAILED, f"{refusal}; job failed")
        scope = "" if action.target == "job" else f" (asked for {action.target})"
        return self._outcome(
            action, OutcomeStatus.DONE, f"restarted all ranks as attempt {self.attempt}{scope}"
        )

    def restart_refusal(self) -> str | None:
        """Why the next restart of the job would be refused, or None."""
        if self._no_restart is not None:
            return self._no_restart
        if self.restarts >= self.max_restarts:
            return f"restart budget of {self.max_restarts} spent"
        return None

    def outcomes(self) -> list[Outcome]:
        """Every action here is over when ``execute`` returns: none is ever pending."""
        return []

    def look_now(self) -> bool:
        """Hangs are the detectors' to find, from telemetry: nothing to look at sooner."""
        return False

    # ---- state -----------------------------------------------------------------------------
    def log_path(self, rank: int) -> Path | None:
        """The log file of the rank's current process."""
        found = self._ranks.get(rank)
        return None if found is None else found.log_path

    def alive(self) -> int:
        return sum(1 for rank in self._ranks if self.launcher.running(rank))

    def pids(self) -> dict[int, int]:
        found = {rank: self.launcher.pid(rank) for rank in self._ranks}
        return {rank: pid for rank, pid in found.items() if pid is not None}

    @property
    def finished(self) -> bool:
        return self.phase in (Phase.SUCCEEDED, Phase.FAILED)

    def _failed(self) -> bool:
        return self._first_failure is not None

    def _emit(
        self, subject: str, phase: Phase, time: float | None = None, **detail: object
    ) -> None:
        self._events.append(
            LifecycleEvent(
                subject, phase, self.clock() if time is None else time, self.attempt, detail
            )
        )

    def _take_events(self) -> list[LifecycleEvent]:
        events, self._events = self._events, []
        return events

    def _outcome(self, action: Action, status: OutcomeStatus, detail: str) -> Outcome:
        return Outcome(action, status, detail, self.clock())


def _python() -> str:
    import sys

    return sys.executable
