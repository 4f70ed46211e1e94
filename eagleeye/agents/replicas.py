"""The controller's job loop across hosts with replicas as the unit of failure
(``eagleeye controller --recovery replica``).

The one-machine ``ReplicaSupervisor`` runs in the controller, composed with an
``AgentLauncher`` (its ranks started, signalled and stopped by the agents) and a quorum
whose store the controller hosts on its listen address, authenticated by a secret every
agent derives from the job's shared secret (``wire.replica_secret``: it never crosses the
network). Ranks catch up from each other directly, each catch-up server on its host's
advertised address.

It waits for one agent per node rank, starts every replica through them, and records
every launch, exit, membership, finding and action in the run store. A rank exiting
non-zero is a ``process_exit`` finding answered by the remediation policy (the built-in
one restarts only its replica, which catches up from a healthy one). An agent lost
(``Membership.lost``, on the controller's clock) is a ``host_lost`` finding, answered as
an eviction: the host is fenced (its ranks ended when its link comes back, its agent then
joining again as a spare), its ranks count as exited, the first spare host takes its node
rank and only the replicas that ran there restart on it, catching up from a healthy
replica; the other replicas never stop. With no spare the job goes on with the replicas
left. The job ends when the supervisor says so (the healthy replicas finished, or too
few left and no budget); every agent is then told to stop.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from collector.types import Sample, Subject
from detectors.types import Finding, Severity
from eagleeye.agents.agentlauncher import AgentLauncher
from eagleeye.agents.intake import SummaryIntake
from eagleeye.agents.membership import AgentLost, AgentReport, AgentState, Membership
from eagleeye.agents.spares import Spares, is_spare
from eagleeye.agents.stopped import STOPPED
from eagleeye.detection import fenced_hang
from eagleeye.store import RunStore
from ft_runtime.errors import LaunchError
from ft_runtime.layout import JobLayout
from ft_runtime.quorum import QuorumService
from ft_runtime.replica.supervisor import ReplicaSupervisor
from ft_runtime.supervisor import LaunchSpec
from ft_runtime.types import Action, ActionKind, LifecycleEvent, Outcome, OutcomeStatus, Phase
from remediation.policy import Policy, replica_restart_policy
from remediation.remediator import Remediator

log = logging.getLogger(__name__)


@dataclass
class ReplicaCoordinator:
    """Args:
    members: the agents' membership.
    layout: the job's layout (one agent per node rank, ``replicas`` replicas).
    store: the run store.
    secret: the quorum store's secret (``wire.replica_secret`` of the job's secret).
    store_host: the controller's address the ranks reach the quorum's store at.
    log_dir: where the supervisor keeps its per-replica folders.
    max_restarts: restart budget of each replica.
    max_job_restarts: whole-job restarts, the last resort.
    min_replicas: fewer healthy replicas and the whole job restarts.
    policy: answers the findings on ranks (process exits).
    dry_run: decide and record only (None: the policy's).
    on_update: called with every event, finding and outcome (the console).
    """

    members: Membership
    layout: JobLayout
    store: RunStore
    secret: str
    store_host: str = "127.0.0.1"
    run_id: str = "eagleeye"
    log_dir: Path = Path("replicas")
    max_restarts: int = 3
    max_job_restarts: int = 1
    min_replicas: int = 1
    policy: Policy = field(default_factory=replica_restart_policy)
    dry_run: bool | None = None
    on_update: Callable[[object], None] = lambda item: None
    clock: Callable[[], float] = time.time
    grace_s: float = 0.0
    phase: Phase = Phase.PRE_CHECK
    launcher: AgentLauncher = field(init=False)
    supervisor: ReplicaSupervisor | None = None
    remediator: Remediator | None = None
    _by_node: dict[int, AgentState] = field(default_factory=dict)
    _spares: Spares = field(init=False)
    _stop: str | None = None
    _on_lost_hosts: set[int] = field(default_factory=set)  # ended with a host, no spare

    def __post_init__(self) -> None:
        self._spares = Spares(self.members)
        self.launcher = AgentLauncher(self.members, self.layout, self.clock)
        self.members.intake = SummaryIntake(self.layout, clock=self.clock)

    def request_stop(self, cause: str) -> None:
        """Ends the job from outside (a signal); recorded."""
        self._stop = cause

    def run(self, join_timeout_s: float = 120.0, limit_s: float = float("inf")) -> Phase:
        """Runs the job to its end; returns SUCCEEDED or FAILED."""
        deadline = self.clock() + join_timeout_s
        while len(self._by_node) < self.layout.nnodes:
            if self._stop is not None:
                return self._end(Phase.FAILED, f"stopped by {self._stop}")
            if self.clock() > deadline:
                missing = sorted(set(range(self.layout.nnodes)) - set(self._by_node))
                return self._end(Phase.FAILED, f"no agent joined for node ranks {missing}")
            self._poll()
        supervisor = self._start()
        end = self.clock() + limit_s
        while not supervisor.finished and self.phase is Phase.RUNNING:
            if self._stop is not None or self.clock() > end:
                why = f"stopped by {self._stop}" if self._stop is not None else "time limit"
                return self._end(Phase.FAILED, why)
            self._poll()
            for gone in self.members.lost():
                self._host_lost(gone)
            try:
                self._step()
            except LaunchError as exc:  # a restart onto a host that is gone, with no spare
                return self._end(Phase.FAILED, f"the job cannot go on: {exc}")
        if self.phase is not Phase.RUNNING:  # ended already (a spare that could not start)
            return self.phase
        return self._end(supervisor.phase, "")

    def _start(self) -> ReplicaSupervisor:
        master = self._by_node[0]
        launch = LaunchSpec(
            (),
            self.layout,
            self.run_id,
            str(self.log_dir),
            master_addr=str(master.info.get("address") or master.host),
        )
        quorum = QuorumService(
            self.layout.replicas,
            self.layout.replica_size,
            host=self.store_host,
            min_replicas=self.min_replicas,
            clock=self.clock,
            secret=self.secret,
        )
        for node, agent in self._by_node.items():
            self.launcher.place(node, agent.agent)
        supervisor = ReplicaSupervisor(
            launch,
            quorum,
            max_restarts=self.max_restarts,
            clock=self.clock,
            max_job_restarts=self.max_job_restarts,
            joiner_nice=0,  # no priority across hosts: a spare host trains nothing else
            launcher=self.launcher,
        )
        self.supervisor = supervisor
        self.remediator = Remediator(self.policy, supervisor, self.dry_run, clock=self.clock)
        self.phase = Phase.RUNNING
        supervisor.start()
        self._record(supervisor.poll())
        return supervisor

    def _step(self) -> None:
        """One look of the supervisor: exits, hangs, joins; a rank's failure is answered."""
        assert self.supervisor is not None
        assert self.remediator is not None
        for event in self.supervisor.poll():
            self._record([event])
            if _fenced_as_hung(event):
                self._hung(event)
            code = event.detail.get("exit_code")
            if event.phase is not Phase.EXITED or not event.subject.startswith("rank:"):
                continue
            rank = int(event.subject.removeprefix("rank:"))
            if not code or event.detail.get("collateral") or rank in self._on_lost_hosts:
                continue
            self._answer(self._exit_finding(rank, int(code)))
        for outcome in self.supervisor.outcomes():
            self.store.add_outcome(outcome, None, False, outcome.time)
            self.on_update(outcome)
        self._record(self.supervisor.settle())

    def _hung(self, event: LifecycleEvent) -> None:
        """A replica the quorum dropped as hung (its ranks never entered the exchange the
        others waited in past the stall limit): a ``hang`` finding, its fencing kill the
        action; the killed ranks' exits that follow are answered as failures (a restart
        of the replica), as under ``eagleeye run``."""
        finding, outcome = fenced_hang(event, {})  # no step series on the controller
        finding_id = self.store.add_finding(finding)
        self.on_update(finding)
        self.store.add_outcome(outcome, finding_id, dry_run=False, decided_at=event.time)

    def _exit_finding(self, rank: int, code: int) -> Finding:
        spec = self.layout.rank(rank)
        return Finding(
            "process_exit",
            Subject(replica=spec.replica, rank=rank, node=spec.node),
            1.0,
            Severity.CRITICAL,
            self.clock(),
            None,
            {"exit_code": float(code)},
            "process_exit",
        )

    def _answer(self, finding: Finding) -> None:
        assert self.remediator is not None
        finding_id = self.store.add_finding(finding)
        self.on_update(finding)
        for decision in self.remediator.handle(finding):
            self.store.add_outcome(
                decision.outcome, finding_id, decision.dry_run, decision.decided_at
            )
            self.on_update(decision)

    def _poll(self) -> None:
        for got in self.members.poll(timeout_s=0.05):
            if isinstance(got, AgentState):
                self._joined(got)
            elif isinstance(got, AgentReport):
                self._report(got)
        intake = self.members.intake
        if intake is not None:  # the ranks' summaries: drained (judged in job recovery)
            intake.frames(hosts=self.layout.nnodes)

    def _joined(self, agent: AgentState) -> None:
        if is_spare(agent):
            self._spare_joined(agent)
            return
        held = self._by_node.get(agent.node_rank)
        if self.phase is Phase.RUNNING and held is not None and held.agent != agent.agent:
            why = f"node rank {agent.node_rank} is held by {held.agent} in this job"
            self.members.fence(agent.agent, why, key="refused")
            self._event(f"agent:{agent.agent}", Phase.EXITED, host=agent.host, reason=why)
            return
        self._by_node[agent.node_rank] = agent
        self._event(f"agent:{agent.agent}", Phase.RUNNING, host=agent.host, node=agent.node_rank)

    def _spare_joined(self, agent: AgentState) -> None:
        """A spare admitted; a fenced host's agent joining again as one
        (``rejoined_from``) only when it says its ranks ended."""
        rejoined = agent.info.get("rejoined_from")
        if rejoined is not None and agent.info.get("ranks_ended") is not True:
            why = f"{rejoined} joins again as a spare before its ranks ended"
            self.members.fence(agent.agent, why, key="refused")
            self._event(f"agent:{agent.agent}", Phase.EXITED, host=agent.host, reason=why)
            return
        self._spares.join(agent)
        again = {} if rejoined is None else {"rejoined_from": str(rejoined), "ranks_ended": True}
        self._event(f"agent:{agent.agent}", Phase.RUNNING, host=agent.host, spare=True, **again)

    def _report(self, report: AgentReport) -> None:
        body = report.body
        if report.kind == "launched":
            rank, pid, attempt = int(body["rank"]), int(body["pid"]), int(body["attempt"])
            if self.launcher.launched(report.agent, rank, pid, attempt):
                state = self.members.agents.get(report.agent)
                host = state.host if state is not None else report.agent
                self._event(f"rank:{rank}", Phase.RUNNING, agent=report.agent, host=host, pid=pid)
        elif report.kind == "exit":
            rank, code, attempt = int(body["rank"]), int(body["code"]), int(body["attempt"])
            self.launcher.exited(report.agent, rank, code, attempt)
        elif report.kind == "samples":
            self._stops(report)
        elif report.kind == "leaving":
            cause = str(body.get("cause", "a signal"))
            self._event(f"agent:{report.agent}", Phase.EXITED, reason=f"{cause} to the agent")
            if self._stop is None:
                self._stop = f"{cause} to the agent {report.agent}"
        elif report.kind == "outcome":
            self.on_update(report)

    def _stops(self, report: AgentReport) -> None:
        """A host's word on its ranks' processes (stopped, or running again): stored, and
        given to the launcher, where the supervisor's looks read it."""
        try:
            samples = [Sample.from_json(row) for row in report.body.get("samples", [])]
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("dropped the samples of %s: %s", report.agent, exc)
            return
        looks = [s for s in samples if s.name == STOPPED and s.labels.get("rank", "").isdigit()]
        for look in looks:
            rank, generation = int(look.labels["rank"]), look.labels.get("attempt", "")
            if generation.isdigit():
                self.launcher.stopped(report.agent, rank, int(generation), look.value > 0)
        self.store.add_samples(looks)

    def _host_lost(self, gone: AgentLost) -> None:
        """A host lost: fenced, its ranks ended, its node rank given to a spare on which
        only its replicas restart (they catch up from a healthy one)."""
        held = self._by_node.get(gone.node_rank)
        if held is None or held.agent != gone.agent:  # a spare, or no node rank's host
            self._spares.drop(gone.agent)
            self._event(f"agent:{gone.agent}", Phase.EVICTED, host=gone.host, spare=True)
            return
        assert self.supervisor is not None
        node = gone.node_rank
        finding = gone.finding()
        finding_id = self.store.add_finding(finding)
        self.on_update(finding)
        self._event(f"agent:{gone.agent}", Phase.EVICTED, host=gone.host, node=node)
        reason = f"host {gone.host} (node rank {node}) was lost"
        ended = self.launcher.host_lost(gone.agent)  # exits the supervisor reads next
        spare = self._spares.take()
        again = self.members.new_name(held.host) if spare is not None else None
        self.members.fence(gone.agent, reason, rejoin=again)
        if spare is None:  # their exits drop their replicas; nothing restarts them
            self._on_lost_hosts.update(ended)
            why = f"no spare host: the replicas of node rank {node} are lost; the others go on"
            self._outcome(finding_id, OutcomeStatus.DONE, why)
            return
        self.members.assign(spare.agent, node)
        self._by_node[node] = spare
        self.launcher.place(node, spare.agent)
        try:
            moved = self.supervisor.evict(
                f"node{node}", f"{reason}: moved to the spare {spare.agent}"
            )
        except LaunchError as exc:  # the spare went away between its hello and now
            why = f"node rank {node} could not restart on the spare {spare.agent}: {exc}"
            self._outcome(finding_id, OutcomeStatus.FAILED, why)
            self._end(Phase.FAILED, why)
            return
        source = self.supervisor.quorum.current.source
        why = (
            f"node rank {node} moved to the spare {spare.agent} on {spare.host}; "
            f"replicas {moved} restarted there, catching up from replica {source}"
        )
        self._outcome(finding_id, OutcomeStatus.DONE, why)

    def _end(self, phase: Phase, reason: str) -> Phase:
        """Ends the job: the supervisor's ranks and quorum (its store closed), then every
        agent is told to stop (ending what it runs). ``reason`` empty: the supervisor
        recorded the end itself."""
        supervisor = self.supervisor
        if supervisor is not None:
            if supervisor.finished:
                supervisor.stop_all(0.0)
            else:
                supervisor.stop(reason, self.grace_s)
                reason = ""  # recorded by the supervisor's stop
            self._record(supervisor.settle())  # what is left of its events
        self.phase = phase
        for agent in self.members.alive():
            self.members.send(agent.agent, "stop", {"grace_s": self.grace_s})
        if reason:
            self._event("job", phase, reason=reason)
        return phase

    def _outcome(self, finding_id: int, status: OutcomeStatus, why: str) -> None:
        now = self.clock()
        action = Action(ActionKind.EVICT, "job", why, f"evict:host:{finding_id}")
        outcome = Outcome(action, status, why, now)
        self.store.add_outcome(outcome, finding_id, False, now)
        self.on_update(outcome)

    def _record(self, events: list[LifecycleEvent]) -> None:
        for event in events:
            if event.detail.get("pid") == 0:  # the agent reports the real one (rank RUNNING)
                detail = {k: v for k, v in event.detail.items() if k != "pid"}
                event = dataclasses.replace(event, detail=detail)
            self.store.add_event(event)
            self.on_update(event)

    def _event(self, subject: str, phase: Phase, **detail: object) -> None:
        attempt = 0 if self.supervisor is None else max(self.supervisor.attempt, 0)
        event = LifecycleEvent(subject, phase, self.clock(), attempt, detail)
        self.store.add_event(event)
        self.on_update(event)


def _fenced_as_hung(event: LifecycleEvent) -> bool:
    return (
        event.phase is Phase.EXITED
        and event.subject.startswith("replica:")
        and str(event.detail.get("reason", "")).startswith("hung")
    )


__all__ = ["ReplicaCoordinator"]
