"""The ``Launcher`` of a replica job across hosts: ranks started, signalled and stopped by
the agents (``ft_runtime.launcher`` describes the interface).

A ``ReplicaSupervisor`` given this launcher runs in the controller and never touches a
process: ``start`` asks the agent holding the rank's node rank to start it (the agent runs
its own command line, adding its host's variables: ``HostAgent._start_rank``), ``signal``
and ``stop`` are messages to that agent. What the agents report comes in through
``launched`` and ``exited`` (the coordinator routes their reports here). A host lost turns
into exits of every rank it ran (``host_lost``: SIGKILL's status, at the moment the loss
was found), so the supervisor drops its replica as it would a crashed one. Nothing waits:
``stop`` counts the ranks it asked to end as ended at once (their agent ends them in the
order its messages came, before any later start), and ``pid`` is unknown (None) until the
agent reported the launch. The process state is its host's: its agent reports a rank it
found stopped (``eagleeye.agents.stopped``: state ``T`` at two looks in a row) and
``stopped`` records it, so ``sample`` says such a rank is stopped (``STOPPED_LOOK``: the
supervisor then holds it hung as soon as the others wait for it, as on one machine) and
any other live rank running (``UNSEEN``: judged by the quorum's stall limits, with the
allowance of a straggler).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from ft_runtime.errors import LaunchError
from ft_runtime.launcher import RankExit
from ft_runtime.layout import JobLayout, RankSpec
from ft_runtime.procstat import ProcSample

__all__ = ["STOPPED_LOOK", "UNSEEN", "AgentLauncher"]

UNSEEN = ProcSample("R", 0)
"""The look at a live rank on another host: running, as far as the controller can tell."""
STOPPED_LOOK = ProcSample("T", 0)
"""The look at a rank its agent reported stopped (SIGSTOP) and not running again since."""


class Sender(Protocol):
    """What the launcher sends through (``Membership.send``)."""

    def send(self, agent: str, kind: str, body: Mapping[str, object]) -> bool: ...


class AgentLauncher:
    """Ranks of ``layout`` on the agents holding their node ranks.

    Args:
        members: sends to an admitted agent (the controller's ``Membership``).
        layout: the job's layout (sent with every start: a spare learns it so).
        clock: wall-clock time, seconds, stamped on the exits of a lost host.
    """

    def __init__(
        self,
        members: Sender,
        layout: JobLayout,
        clock: Callable[[], float] = time.time,
        send_argv: bool = False,
    ) -> None:
        self.members = members
        self.send_argv = send_argv  # local agents (eagleeye run --local-agents) run it
        self.layout = layout
        self.clock = clock
        self.agents: dict[int, str] = {}  # node rank -> the agent holding it
        self._where: dict[int, str] = {}  # rank -> the agent its current process runs on
        self._generation: dict[int, int] = {}
        self._pids: dict[int, int] = {}
        self._ended: set[int] = set()  # ranks whose current process ended (or was ended)
        self._lost: set[str] = set()
        self._exits: list[RankExit] = []
        self._stopped: set[int] = set()  # ranks whose agent reported their process stopped

    def place(self, node_rank: int, agent: str) -> None:
        """``agent`` holds ``node_rank`` from now on (a spare taking a lost host's; a local
        agent started again under its old name)."""
        self.agents[node_rank] = agent
        self._lost.discard(agent)

    # ---- the Launcher protocol --------------------------------------------------------------
    def start(
        self,
        spec: RankSpec,
        generation: int,
        argv: Sequence[str],
        env: Mapping[str, str],
        log_path: Path,
        nice: int = 0,
    ) -> int:
        """Asks the agent of the rank's node rank to start it; returns 0 (its pid comes
        with the agent's report). ``argv`` is not sent: every agent runs the command it
        was started with (unless ``send_argv``: an agent started with ``--local`` runs
        it). ``nice`` is not applied across hosts."""
        agent = self.agents.get(spec.node_rank)
        if agent is None or agent in self._lost:
            raise LaunchError(
                f"no agent holds node rank {spec.node_rank} for rank {spec.rank}; "
                "start an agent for it or a spare (eagleeye agent --spare)"
            )
        body = {
            "rank": spec.rank,
            "node_rank": spec.node_rank,
            "generation": generation,
            "env": dict(env),
            "log": f"{log_path.parent.name}/{log_path.name}",
            "nnodes": self.layout.nnodes,
            "nproc_per_node": self.layout.nproc_per_node,
            "replicas": self.layout.replicas,
        }
        if self.send_argv:
            body["argv"] = list(argv)
        if not self.members.send(agent, "start_rank", body):
            raise LaunchError(f"the agent {agent} of node rank {spec.node_rank} is not connected")
        self._where[spec.rank] = agent
        self._generation[spec.rank] = generation
        self._pids.pop(spec.rank, None)
        self._ended.discard(spec.rank)
        self._stopped.discard(spec.rank)
        return 0

    def exits(self) -> list[RankExit]:
        found, self._exits = self._exits, []
        return found

    def signal(self, rank: int, sig: int) -> None:
        agent = self._where.get(rank)
        if agent is not None and agent not in self._lost and rank not in self._ended:
            self.members.send(agent, "signal", {"rank": rank, "sig": int(sig)})

    def stop(self, ranks: Collection[int], grace_s: float) -> None:
        """Asks each agent to end its ranks among ``ranks`` (SIGCONT and SIGTERM, SIGKILL
        after ``grace_s``); counted as ended now, each with SIGKILL's status."""
        by_agent: dict[str, list[int]] = {}
        for rank in ranks:
            agent = self._where.get(rank)
            if agent is None or rank in self._ended:
                continue
            self._end(rank, -signal.SIGKILL)
            if agent not in self._lost:
                by_agent.setdefault(agent, []).append(rank)
        for agent, mine in by_agent.items():
            self.members.send(agent, "stop_ranks", {"ranks": sorted(mine), "grace_s": grace_s})

    def running(self, rank: int) -> bool:
        return rank in self._where and rank not in self._ended

    def pid(self, rank: int) -> int | None:
        return self._pids.get(rank)

    def sample(self, rank: int) -> ProcSample | None:
        """A live rank its agent reported stopped: ``STOPPED_LOOK``; any other live one is
        taken as running (``UNSEEN``); an ended one, or one never started, is None."""
        if not self.running(rank):
            return None
        return STOPPED_LOOK if rank in self._stopped else UNSEEN

    def stopped(self, agent: str, rank: int, generation: int, stopped: bool) -> bool:
        """``agent`` found ``rank``'s process stopped (or running again); False when that
        is not the rank's current process."""
        if self._where.get(rank) != agent or self._generation.get(rank) != generation:
            return False
        if stopped:
            self._stopped.add(rank)
        else:
            self._stopped.discard(rank)
        return True

    # ---- what the agents report -------------------------------------------------------------
    def launched(self, agent: str, rank: int, pid: int, generation: int) -> bool:
        """An agent started ``rank``; False when that is not the rank's current process."""
        if self._where.get(rank) != agent or self._generation.get(rank) != generation:
            return False
        self._pids[rank] = pid
        return True

    def exited(self, agent: str, rank: int, code: int, generation: int, ago_s: float = 0.0) -> bool:
        """A rank's process ended on ``agent``, ``ago_s`` before its report came; False
        when it was not the rank's current one (an earlier generation, another host's)
        or its end was counted already."""
        if self._where.get(rank) != agent or self._generation.get(rank) != generation:
            return False
        if rank in self._ended:
            return False
        self._end(rank, code, ago_s)
        return True

    def host_lost(self, agent: str) -> list[int]:
        """The host of ``agent`` is gone: every rank it ran ends now (SIGKILL's status);
        nothing more is sent to it. Returns those ranks."""
        self._lost.add(agent)
        gone = sorted(r for r, a in self._where.items() if a == agent and r not in self._ended)
        for rank in gone:
            self._end(rank, -signal.SIGKILL)
        return gone

    def ranks_on(self, agent: str) -> list[int]:
        """The ranks whose current process runs on ``agent``."""
        return sorted(r for r, a in self._where.items() if a == agent)

    def _end(self, rank: int, code: int, ago_s: float = 0.0) -> None:
        self._ended.add(rank)
        self._exits.append(RankExit(rank, self._generation[rank], code, self.clock() - ago_s))
