"""`eagleeye run --local-agents`: the run's ranks started by agents on this machine.

``LocalAgents`` starts one `eagleeye agent` per (virtual) node of the job, each a child
of this process that dies with it (and its ranks with the agent), joined to a loopback
``Membership`` authenticated by a secret made for the run (a 0600 file in the run
folder). It is the supervisor's ``Launcher``: every start, signal and stop is a message to
the agent holding the rank's node rank (``AgentLauncher``), and the agents' reports
(launches, exits, stopped ranks) are taken whenever the supervisor looks for exits. So the
one-machine path and the cluster path run the same agent code.

What stays of the one-machine path: the agents run here, so a start waits for its agent's
report of the launch and returns the real pid (the outside fault injector and the stack
capture signal it), a stop waits until the ranks' processes are gone, and ``sample``
reads each rank's process state from /proc (a stopped rank is seen at once). The ranks'
telemetry goes straight to the run's own receiver: an agent started with ``--local``
lets the environment and command line the supervisor gives win over its own. An agent
process that ends on its own is a lost host: every rank it ran counts as ended
(SIGKILL's status), and the agent is started again (``MAX_RESPAWNS`` times per node), so
the supervisor's restart finds it there. Each agent's join and each rank's launch are
recorded with the agent and its host (``on_event``).
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path

from eagleeye.agents.agentlauncher import AgentLauncher
from eagleeye.agents.membership import AgentReport, AgentState, Membership, ended_ago_s
from eagleeye.agents.stopped import STOPPED
from eagleeye.errors import EagleEyeError
from ft_runtime import procstat
from ft_runtime._children import die_with_parent
from ft_runtime.errors import LaunchError
from ft_runtime.launcher import RankExit
from ft_runtime.layout import JobLayout, RankSpec
from ft_runtime.priority import ENV_BASE_NICE
from ft_runtime.procstat import ProcSample
from ft_runtime.types import Phase

__all__ = ["SECRET_FILE", "LocalAgents"]

log = logging.getLogger(__name__)

SECRET_FILE = "agents.secret"
"""The run's agent secret, in its run folder (mode 0600; removed when the run ends)."""
MAX_RESPAWNS = 3
"""How many times a node's agent that ended on its own is started again in one run."""


class LocalAgents:
    """One agent per node of ``layout`` on this machine, as the supervisor's launcher.

    Args:
        run_dir: the run's folder (the secret, ``agents/agent-N.log``; ranks log in ``logs``).
        layout: the job's layout (one agent per node rank).
        command: the ranks' command line after the interpreter (the agents' own).
        hostname: this machine's name, as the agents report it.
        on_event: called with each agent's join and each rank's launch (subject, phase,
            detail).
        join_timeout_s: how long the agents may take to join.
    """

    def __init__(
        self,
        run_dir: Path,
        layout: JobLayout,
        command: Sequence[str],
        hostname: str,
        on_event: Callable[[str, Phase, dict[str, object]], None] = lambda *_: None,
        join_timeout_s: float = 60.0,
        launch_timeout_s: float = 60.0,
    ) -> None:
        self.run_dir = run_dir
        self.layout = layout
        self.command = list(command)
        self.hostname = hostname
        self.on_event = on_event
        self.join_timeout_s = join_timeout_s
        self.launch_timeout_s = launch_timeout_s
        self.members: Membership | None = None
        self.inner: AgentLauncher | None = None
        self.agents: dict[str, subprocess.Popen[bytes]] = {}  # agent name -> its process
        self._respawns: dict[int, int] = {}  # node rank -> agents started again for it
        self._lost: set[str] = set()
        self._joining: dict[int, str] = {}  # node rank -> its agent, started, not joined yet
        self._secret_path: Path | None = None
        self._port = ""
        self._closing = False

    # ---- the agents ---------------------------------------------------------------------------
    def __enter__(self) -> LocalAgents:
        try:
            self.open()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> None:
        """Starts the agents and waits until each joined."""
        secret = secrets.token_hex(32).encode()
        path = self.run_dir / SECRET_FILE
        path.unlink(missing_ok=True)  # a killed run's (resumed with --resume)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(secret)
        self.members = Membership(secret, "tcp://127.0.0.1:0")
        self.inner = AgentLauncher(self.members, self.layout, send_argv=True)
        (self.run_dir / "agents").mkdir(exist_ok=True)
        self._secret_path = path
        self._port = self.members.address.rpartition(":")[2]
        for node in range(self.layout.nnodes):
            self._spawn(node)
        self._join()

    def _spawn(self, node: int) -> None:
        """Starts the agent of ``node`` (again, for one that ended)."""
        argv = [
            sys.executable, "-m", "eagleeye", "agent",
            "--controller", f"127.0.0.1:{self._port}", "--secret-file", str(self._secret_path),
            "--node-rank", str(node), "--local",
            "--log-dir", str((self.run_dir / "logs").resolve()),
            "--advertise", "127.0.0.1", "--hostname", self.hostname,
            "--gpu-metrics", "off", "--no-host-metrics",
            "--no-instrument",  # the command is `eagleeye run`'s, through the boot or not
            *self.command,
        ]  # fmt: skip
        name = f"{self.hostname}-{node}"
        with (self.run_dir / "agents" / f"agent-{node}.log").open("ab") as out:  # appended
            self.agents[name] = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C reaches `eagleeye run`, which stops
                preexec_fn=die_with_parent(signal.SIGKILL),
            )
        self._lost.discard(name)
        self._joining[node] = name

    def _join(self) -> None:
        assert self.inner is not None
        deadline = time.monotonic() + self.join_timeout_s
        while len(self.inner.agents) < self.layout.nnodes:
            for name, process in self.agents.items():
                if process.poll() is not None:
                    raise EagleEyeError(
                        f"the local agent {name} ended with status {process.returncode} before "
                        f"it joined; see {self.run_dir / 'agents'} for its output"
                    )
            if time.monotonic() > deadline:
                missing = sorted(set(range(self.layout.nnodes)) - set(self.inner.agents))
                raise EagleEyeError(
                    f"no local agent joined for node ranks {missing} within "
                    f"{self.join_timeout_s:.0f} s; see {self.run_dir / 'agents'} for their output"
                )
            self.pump(timeout_s=0.05)

    def pump(self, timeout_s: float = 0.0) -> None:
        """Takes what the agents sent (joins, launches, exits, stopped ranks); an agent
        process that ended loses its ranks."""
        assert self.members is not None
        assert self.inner is not None
        got = self.members.poll(timeout_s)
        gone = [n for n, p in self.agents.items() if p.poll() is not None and n not in self._lost]
        # What an ended agent sent came before its end, and its end (its ranks killed with
        # it) before what the others sent since: a rank of theirs that died of it (a
        # collective's reset) is seen after it, as the cascade it is, not as the first failure.
        for item in [g for g in got if g.agent in gone]:
            self._take(item)
        for name in gone:
            self._agent_ended(name)
        for item in [g for g in got if g.agent not in gone]:
            self._take(item)

    def _take(self, got: AgentState | AgentReport) -> None:
        if isinstance(got, AgentState):
            self._joined(got)
        else:
            self._report(got)

    def _agent_ended(self, name: str) -> None:
        """An agent process that ended on its own: its ranks are lost with it."""
        assert self.inner is not None
        process = self.agents[name]
        self._lost.add(name)
        ended = self.inner.host_lost(name)
        why = f"the local agent ended with status {process.returncode}"
        if ended:
            self.on_event(f"agent:{name}", Phase.EXITED, {"host": self.hostname, "reason": why})
        self._replace(name, why)

    def _replace(self, name: str, why: str) -> None:
        """An agent that ended on its own is started again (its ranks are gone with it; the
        supervisor's answer to their exits starts them on the new agent), up to
        ``MAX_RESPAWNS`` times per node; not once the run is closing."""
        node = int(name.rpartition("-")[2])
        if self._closing or self._respawns.get(node, 0) >= MAX_RESPAWNS:
            self._joining.pop(node, None)
            return
        self._respawns[node] = self._respawns.get(node, 0) + 1
        log.warning("local agent %s ended (%s); starting it again", name, why)
        self._spawn(node)

    def _joined(self, agent: AgentState) -> None:
        assert self.inner is not None
        if agent.agent not in self.agents or agent.node_rank < 0:
            why = f"{agent.agent} is not an agent this run started"
            assert self.members is not None
            self.members.fence(agent.agent, why, key="refused")
            return
        self.inner.place(agent.node_rank, agent.agent)
        self._joining.pop(agent.node_rank, None)
        detail: dict[str, object] = {"host": agent.host, "node": agent.node_rank}
        detail["pid"] = self.agents[agent.agent].pid
        self.on_event(f"agent:{agent.agent}", Phase.RUNNING, detail)

    def _report(self, report: AgentReport) -> None:
        assert self.inner is not None
        body = report.body
        if report.kind == "launched":
            rank, pid, attempt = int(body["rank"]), int(body["pid"]), int(body["attempt"])
            if self.inner.launched(report.agent, rank, pid, attempt):
                detail: dict[str, object] = {"agent": report.agent, "host": self.hostname}
                detail["pid"] = pid
                self.on_event(f"rank:{rank}", Phase.RUNNING, detail)
        elif report.kind == "exit":
            rank, code, attempt = int(body["rank"]), int(body["code"]), int(body["attempt"])
            self.inner.exited(report.agent, rank, code, attempt, ended_ago_s(body))
        elif report.kind == "samples":
            for row in body.get("samples", []):
                labels = row.get("labels", {}) if isinstance(row, dict) else {}
                who, generation = str(labels.get("rank", "")), str(labels.get("attempt", ""))
                if row.get("name") == STOPPED and who.isdigit() and generation.isdigit():
                    stopped = float(row.get("value", 0.0)) > 0
                    self.inner.stopped(report.agent, int(who), int(generation), stopped)
        elif report.kind == "outcome" and str(body.get("status", "done")) != "done":
            log.warning("local agent %s: %s %s", report.agent, body.get("action"), body["status"])

    def close(self) -> None:
        """Tells every agent to stop (ending what it runs) and waits for it; one that does
        not end is killed. The secret file is removed."""
        self._closing = True
        if self.members is not None:
            for state in self.members.alive():
                self.members.send(state.agent, "stop", {"grace_s": 0.0})
        deadline = time.monotonic() + 10.0
        for process in self.agents.values():
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self.members is not None:
            self.members.close()
        (self.run_dir / SECRET_FILE).unlink(missing_ok=True)

    # ---- the Launcher protocol ----------------------------------------------------------------
    def start(
        self,
        spec: RankSpec,
        generation: int,
        argv: Sequence[str],
        env: Mapping[str, str],
        log_path: Path,
        nice: int = 0,
    ) -> int:
        """Asks the rank's agent to start it and waits for its launch; returns its pid."""
        assert self.inner is not None
        self._await_agent(spec)
        env = dict(env)
        if nice:  # the level it returns to once it may (``priority.restore_priority``)
            env[ENV_BASE_NICE] = str(os.getpriority(os.PRIO_PROCESS, 0))
        self.inner.start(spec, generation, argv, env, log_path, nice)
        deadline = time.monotonic() + self.launch_timeout_s
        while (pid := self.inner.pid(spec.rank)) is None:
            if not self.inner.running(spec.rank):  # its agent ended meanwhile
                raise LaunchError(f"the local agent of rank {spec.rank} ended before its start")
            if time.monotonic() > deadline:
                raise LaunchError(
                    f"the local agent of node rank {spec.node_rank} did not start rank "
                    f"{spec.rank} within {self.launch_timeout_s:.0f} s; see "
                    f"{self.run_dir / 'agents'} for its output"
                )
            self.pump(timeout_s=0.02)
        if nice:
            _lower_priority(pid, nice)
        return pid

    def _await_agent(self, spec: RankSpec) -> None:
        """Waits while the agent of the rank's node is started again and joins."""
        deadline = time.monotonic() + self.join_timeout_s
        while spec.node_rank in self._joining and time.monotonic() < deadline:
            self.pump(timeout_s=0.02)  # one that keeps ending is given up: no agent holds it

    def exits(self) -> list[RankExit]:
        assert self.inner is not None
        self.pump()
        return self.inner.exits()

    def signal(self, rank: int, sig: int) -> None:
        assert self.inner is not None
        self.inner.signal(rank, sig)

    def stop(self, ranks: Collection[int], grace_s: float) -> None:
        """Asks the agents to end ``ranks`` and waits until their processes are gone."""
        assert self.inner is not None
        pids = [p for r in ranks if self.inner.running(r) and (p := self.inner.pid(r))]
        self.inner.stop(ranks, grace_s)
        deadline = time.monotonic() + grace_s + 10.0
        while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
            self.pump(timeout_s=0.02)

    def running(self, rank: int) -> bool:
        return self.inner is not None and self.inner.running(rank)

    def pid(self, rank: int) -> int | None:
        return None if self.inner is None else self.inner.pid(rank)

    def sample(self, rank: int) -> ProcSample | None:
        """The rank's process as /proc shows it (the agents run here)."""
        pid = self.pid(rank)
        if pid is None or not self.running(rank):
            return None
        return procstat.sample(pid)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie its agent did not reap yet counts as gone)."""
    seen = procstat.sample(pid)
    return seen is not None and seen.state not in ("Z", "X")


def _lower_priority(pid: int, nice: int) -> None:
    """A joiner's start-up and catch-up must not take CPU from the survivors."""
    try:
        os.setpriority(os.PRIO_PROCESS, pid, os.getpriority(os.PRIO_PROCESS, 0) + nice)
    except OSError as exc:
        log.warning("could not lower the priority of rank pid %d: %s", pid, exc)
