"""Fakes of the runtime for tests of the layers above it (remediation, the controller) and
of the supervisors (a launcher whose ranks are records)."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path

from ft_runtime.launcher import RankExit
from ft_runtime.layout import RankSpec
from ft_runtime.procstat import ProcSample
from ft_runtime.types import Action, Outcome, OutcomeStatus


class FakeRuntime:
    """Records every action it receives and answers with a scripted status.

    >>> from ft_runtime.types import ActionKind
    >>> rt = FakeRuntime()
    >>> rt.execute(Action(ActionKind.NOTIFY, "job", "test", "k")).status.value
    'done'
    >>> len(rt.actions)
    1
    """

    def __init__(
        self,
        status: OutcomeStatus = OutcomeStatus.DONE,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.status = status
        self.clock = clock
        self.actions: list[Action] = []

    def execute(self, action: Action) -> Outcome:
        self.actions.append(action)
        return Outcome(action, self.status, "fake runtime", self.clock())


class FakeLauncher:
    """A ``Launcher`` whose ranks are records: a test ends them (``exit``), stops them
    (``freeze``: a SIGSTOPped rank) and sees every signal and stop the supervisor sent.

    >>> from ft_runtime.layout import JobLayout
    >>> fake = FakeLauncher()
    >>> spec = JobLayout(1, 2, 2).rank(1)
    >>> fake.start(spec, 0, ["python", "train.py"], {}, Path("log"))
    1001
    >>> fake.exit(1, 3)
    >>> [(e.rank, e.code) for e in fake.exits()], fake.running(1)
    ([(1, 3)], False)
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.started: list[tuple[int, int, dict[str, str]]] = []  # rank, generation, env
        self.signals: list[tuple[int, int]] = []
        self.stopped: list[int] = []
        self._live: dict[int, tuple[int, int]] = {}  # rank -> (generation, pid)
        self._pids: dict[int, int] = {}
        self._frozen: set[int] = set()
        self._cpu: dict[int, int] = {}
        self._exits: list[RankExit] = []
        self._next_pid = 1000

    def start(
        self,
        spec: RankSpec,
        generation: int,
        argv: Sequence[str],
        env: Mapping[str, str],
        log_path: Path,
        nice: int = 0,
    ) -> int:
        self._next_pid += 1
        self._live[spec.rank] = (generation, self._next_pid)
        self._pids[spec.rank] = self._next_pid
        self._frozen.discard(spec.rank)
        self.started.append((spec.rank, generation, dict(env)))
        return self._next_pid

    def exit(self, rank: int, code: int) -> None:
        """The rank's process ends with ``code`` (seen by the next ``exits``)."""
        generation, _ = self._live.pop(rank)
        self._exits.append(RankExit(rank, generation, code, self.clock()))

    def freeze(self, rank: int) -> None:
        """The rank stops (as with SIGSTOP): state T, no more CPU time."""
        self._frozen.add(rank)

    def thaw(self, rank: int) -> None:
        """The rank goes on (as with SIGCONT)."""
        self._frozen.discard(rank)

    def exits(self) -> list[RankExit]:
        found, self._exits = self._exits, []
        return found

    def signal(self, rank: int, sig: int) -> None:
        self.signals.append((rank, sig))
        if sig == signal.SIGKILL and rank in self._live:
            self.exit(rank, -signal.SIGKILL)

    def stop(self, ranks: Collection[int], grace_s: float) -> None:
        for rank in ranks:
            self.stopped.append(rank)
            if rank in self._live:
                self.exit(rank, -signal.SIGKILL if grace_s <= 0 else -signal.SIGTERM)

    def running(self, rank: int) -> bool:
        return rank in self._live

    def pid(self, rank: int) -> int | None:
        return self._pids.get(rank)

    def sample(self, rank: int) -> ProcSample | None:
        if rank not in self._live:
            return None
        if rank in self._frozen:
            return ProcSample("T", self._cpu.get(rank, 0))
        self._cpu[rank] = self._cpu.get(rank, 0) + 1_000_000  # it ran since the last look
        return ProcSample("R", self._cpu[rank])
