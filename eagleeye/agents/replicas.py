"""The controller's job loop across hosts with replicas as the unit of failure
(``eagleeye controller --recovery replica``).

The one-machine ``ReplicaSupervisor`` runs in the controller, composed with an
``AgentLauncher`` (its ranks started, signalled and stopped by the agents) and a quorum
whose store runs in a process of its own on the controller's host (``DetachedStore``,
reached at the listen address), authenticated by a secret every agent derives from the
job's shared secret (``wire.replica_secret``: it never crosses the network). Ranks catch
up from each other directly, each catch-up server on its host's advertised address. The
store process outlives a controller killed outright, and the quorum's memberships are
logged in the run store before they are published: a controller started again with the
same command line goes on with the job (``eagleeye.agents.replicaresume``: the state
journaled at each tick, the ranks adopted as their agents say hello again).

It waits for one agent per node rank, starts every replica through them, and records
every launch, exit, membership, finding and action in the run store. A rank exiting
non-zero is a ``process_exit`` finding answered by the remediation policy (the built-in
one restarts only its replica, which catches up from a healthy one). An agent lost
(``Membership.lost``, on the controller's clock) is a ``host_lost`` finding, answered as
an eviction: the host is fenced (its ranks ended when its link comes back, its agent then
joining again as a spare), its ranks count as exited, the first spare host takes its node
rank and only the replicas that ran there restart on it, catching up from a healthy
replica; the other replicas never stop. With no spare the job goes on with the replicas
left. The ranks' telemetry, reduced on the hosts, is stored and judged by the same
detectors as in job recovery (``eagleeye.agents.judging``: a non-finite loss, a rank
slower than its host's others, the job's step time falling off), each finding on its
rank and node and answered by the policy. The samples the agents forward from their
hosts' sources are stored and read by the host rules, and the findings from outside
(Alertmanager's webhook, ``inbox``) placed on
the job's ranks or nodes are answered too (one on a host the job does not run on is
recorded only): the built-in policy's answer to a GPU beyond use (a fatal XID, an
uncorrectable memory error) is an ``evict`` of its node, which the coordinator executes
as a lost host's (a spare takes its node rank and only its replicas restart there; with
no spare they end and the others go on), except that the evicted host (suspected
hardware) stays out: its agent ends, and a spare on that host is refused unless it says
``readmit`` (``eagleeye.agents.eviction``). Every other action goes to the supervisor.
An agent of a node rank that leaves on its own signal (a preemption, a node drain)
while a spare waits is drained the same way (``_drain``: no checkpoint is needed, its
replicas catch up from a healthy one; the host is no suspect, and may join again as a
spare); with no spare the job stops, after the replicas' checkpoint when there is a
grace period. The job ends when the supervisor says so (the healthy replicas finished,
or too few left and no budget); every agent is then told to stop.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from collector.types import Frame, Sample, Subject
from detectors.types import Finding, Severity
from eagleeye.agents import replicaresume
from eagleeye.agents.agentlauncher import AgentLauncher
from eagleeye.agents.eviction import (
    HostRules,
    eviction_cause,
    held_node,
    off_the_job,
    report_samples,
    spare_detail,
    spare_refusal,
)
from eagleeye.agents.graceful import GraceWindow, leaving_grace, stop_grace
from eagleeye.agents.hostjudge import HOST_FINDINGS
from eagleeye.agents.intake import HostMedians, SummaryIntake
from eagleeye.agents.judging import (
    ReducedJudge,
    host_findings,
    job_frames,
    node_rank_of,
)
from eagleeye.agents.membership import (
    AgentLost,
    AgentReport,
    AgentState,
    Membership,
    ended_ago_s,
)
from eagleeye.agents.spares import Spares, is_spare
from eagleeye.agents.stopped import STOPPED
from eagleeye.detection import fenced_hang
from eagleeye.store import RunStore, StoreMembershipLog
from ft_runtime.errors import LaunchError
from ft_runtime.layout import JobLayout
from ft_runtime.quorum import QuorumService
from ft_runtime.replica.supervisor import ReplicaSupervisor
from ft_runtime.storehost import LEASE_S, DetachedStore
from ft_runtime.supervisor import LaunchSpec
from ft_runtime.types import Action, ActionKind, LifecycleEvent, Outcome, OutcomeStatus, Phase
from remediation.policy import Policy, cluster_replica_policy
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
    policy: answers the findings (process exits, hangs, the host rules', the alerts').
    dry_run: decide and record only (None: the policy's).
    on_update: called with every event, finding and outcome (the console).
    inbox: findings from outside (Alertmanager's webhook), taken at every poll.
    on_samples: the hosts' samples, as they arrive (the exporter).
    on_job_frame: the job's frame of each step, reduced from the hosts' summaries (the
        exporter's steps).
    on_joined: every agent admitted for a node rank, or a spare given one (where the
        webhook places alerts).
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
    policy: Policy = field(default_factory=cluster_replica_policy)
    dry_run: bool | None = None
    on_update: Callable[[object], None] = lambda item: None
    clock: Callable[[], float] = time.time
    grace_s: float = 0.0
    inbox: Callable[[], list[Finding]] | None = None
    on_samples: Callable[[list[Sample]], None] = lambda samples: None
    on_job_frame: Callable[[Frame], None] = lambda frame: None
    on_joined: Callable[[AgentState], None] = lambda agent: None
    phase: Phase = Phase.PRE_CHECK
    launcher: AgentLauncher = field(init=False)
    supervisor: ReplicaSupervisor | None = None
    remediator: Remediator = field(init=False)
    _by_node: dict[int, AgentState] = field(default_factory=dict)
    _spares: Spares = field(init=False)
    _stop: str | None = None
    _stop_grace: float | None = None  # an agent leaving gives no more than its own grace
    _asked: str | None = None  # the key of the checkpoint a graceful stop asked for
    _checkpointed: Outcome | None = None  # that checkpoint's final outcome
    _on_lost_hosts: set[int] = field(default_factory=set)  # ended with a host, no spare
    _host_rules: HostRules = field(default_factory=HostRules)
    _evicted: dict[str, str] = field(default_factory=dict)  # host -> why it was evicted
    _judge: ReducedJudge = field(init=False)  # the reduced telemetry's detectors
    store_lease_s: float = LEASE_S  # the store process ends once unrenewed this long
    quorum_store: DetachedStore | None = None  # the quorum's store, in a process of its own
    restored: bool = False  # restarted from the run store: the job runs, agents come back
    adopting: set[str] = field(default_factory=set)  # agents whose ranks are to adopt
    _journaled: dict[str, object] | None = None  # the state last written to the run store
    _renewed: float = 0.0  # when the store's lease was last renewed (monotonic)

    def __post_init__(self) -> None:
        self._spares = Spares(self.members)
        self._judge = ReducedJudge(self.store, self.layout)
        self.launcher = AgentLauncher(self.members, self.layout, self.clock)
        self.members.intake = SummaryIntake(self.layout, clock=self.clock)
        self.remediator = Remediator(self.policy, self, self.dry_run, clock=self.clock)

    def request_stop(self, cause: str) -> None:
        """Ends the job from outside (a signal): every replica's ranks end, after a
        checkpoint when there is a grace period; recorded."""
        self._stop = cause

    def run(self, join_timeout_s: float = 120.0, limit_s: float = float("inf")) -> Phase:
        """Runs the job to its end; returns SUCCEEDED or FAILED."""
        deadline = self.clock() + join_timeout_s
        while len(self._by_node) < self.layout.nnodes and not self.restored:
            if self._stop is not None:
                return self._end(Phase.FAILED, f"stopped by {self._stop}")
            if self.clock() > deadline:
                missing = sorted(set(range(self.layout.nnodes)) - set(self._by_node))
                return self._end(Phase.FAILED, f"no agent joined for node ranks {missing}")
            self._poll()
        supervisor = self.supervisor if self.restored and self.supervisor else self._start()
        end = self.clock() + limit_s
        while not supervisor.finished and self.phase is Phase.RUNNING:
            if self._stop is not None:
                return self._stop_job(f"stopped by {self._stop}")
            if self.clock() > end:
                return self._end(Phase.FAILED, "time limit")
            self._poll()
            for gone in self.members.lost():
                self._host_lost(gone)
            try:
                self._step()
            except LaunchError as exc:  # a restart onto a host that is gone, with no spare
                return self._end(Phase.FAILED, f"the job cannot go on: {exc}")
            self._journal()
        if self.phase is not Phase.RUNNING:  # ended already (a spare that could not start)
            return self.phase
        return self._end(supervisor.phase, "")

    def _stop_job(self, reason: str) -> Phase:
        """Ends the job on a stop request. With a grace period the replicas are first
        asked for a checkpoint the way remediation asks for one (the supervisor's
        ``checkpoint`` command: the source replica saves the step it just committed
        through the script's ``save_checkpoint`` and answers with its step and path), and
        the stop waits for the answer up to half the grace period; the ranks get what is
        left to end. The request and its outcome are in the run store."""
        window = GraceWindow.start(stop_grace(self.grace_s, self._stop_grace), self.clock)
        if window.grace_s > 0:
            self._checkpoint_first(reason, window)
        left = window.left()
        return self._end(Phase.FAILED, reason, 0.0 if left is None else left)

    def _checkpoint_first(self, reason: str, window: GraceWindow) -> None:
        supervisor = self.supervisor
        assert supervisor is not None
        key = f"checkpoint:stop:{supervisor.attempt}"
        action = Action(ActionKind.CHECKPOINT, "job", f"before the stop ({reason})", key)
        self._event("job", Phase.RUNNING, checkpoint_requested=key, reason=reason)
        first = supervisor.execute(action)
        self.store.add_outcome(first, None, False, first.time)
        self.on_update(first)
        if first.status is not OutcomeStatus.PENDING:
            return
        self._asked = key

        def look() -> None:
            self._poll()
            try:
                self._step()
            except LaunchError:  # a restart onto a host that is gone: the stop goes on
                pass

        window.wait(look, lambda: self._checkpointed is not None or supervisor.finished)

    def _stop_checkpoint(self, outcome: Outcome) -> None:
        """The answer to a graceful stop's checkpoint; one saved is also a checkpoint of
        the run (the step and path its replica answered with)."""
        self._checkpointed = outcome
        step, path = outcome.data.get("step"), outcome.data.get("path")
        if outcome.status is OutcomeStatus.DONE and isinstance(step, int):
            attempt = None if self.supervisor is None else max(self.supervisor.attempt, 0)
            self.store.add_checkpoint(
                outcome.time, step, "PERSISTENT", "disk", attempt=attempt, path=str(path)
            )

    def _start(self) -> ReplicaSupervisor:
        """The quorum's store started in a process of its own (it outlives this
        controller: a restarted one reconnects to it), then the supervisor and every
        replica; journaled."""
        master = self._by_node[0]
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.quorum_store = DetachedStore.start(
            self.store_host,
            self.secret,
            self.log_dir / "quorum-store.log",
            lease_s=self.store_lease_s,
        )
        try:
            supervisor = self.supervise(str(master.info.get("address") or master.host), fresh=True)
            for node, agent in self._by_node.items():
                self.launcher.place(node, agent.agent)
            self.phase = Phase.RUNNING
            supervisor.start()
            self._record(supervisor.poll())
            self._journal()
        except BaseException:  # not journaled: no controller could go on with this store
            self.quorum_store.close()
            raise
        return supervisor

    def supervise(self, master_addr: str, fresh: bool = False) -> ReplicaSupervisor:
        """The supervisor of this job (not started), its quorum on the store process and
        its membership log in the run store (``fresh``: a new quorum, whatever the log
        holds of a controller killed before its first journal)."""
        assert self.quorum_store is not None
        launch = LaunchSpec(
            (), self.layout, self.run_id, str(self.log_dir), master_addr=master_addr
        )
        quorum = QuorumService(
            self.layout.replicas,
            self.layout.replica_size,
            host=self.store_host,
            min_replicas=self.min_replicas,
            clock=self.clock,
            log=StoreMembershipLog(self.store, fresh=fresh),
            store_address=self.quorum_store.address,
            secret=self.secret,
        )
        supervisor = ReplicaSupervisor(
            launch,
            quorum,
            max_restarts=self.max_restarts,
            clock=self.clock,
            max_job_restarts=self.max_job_restarts,
            joiner_nice=0,  # no priority across hosts: a spare host trains nothing else
            launcher=self.launcher,
        )
        supervisor.store_host = self.quorum_store  # its end ends the job (the store's close)
        self.supervisor = supervisor
        return supervisor

    def _journal(self) -> None:
        """The state a restarted controller needs, in the run store when it changed
        (``eagleeye.agents.replicaresume``); the store process's lease renewed."""
        now = time.monotonic()
        if self.quorum_store is not None and now - self._renewed >= 1.0:
            self._renewed = now
            try:
                self.quorum_store.renew()
            except RuntimeError as exc:  # the store is gone: the supervisor's next look
                log.warning("the quorum's store did not take its lease: %s", exc)
        if self.supervisor is not None and self.phase is Phase.RUNNING:
            self._journaled = replicaresume.save(self.store, self, self._journaled)

    def _step(self) -> None:
        """One look of the supervisor: exits, hangs, joins; a rank's failure is answered."""
        assert self.supervisor is not None
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
            if outcome.action.key == self._asked:
                self._stop_checkpoint(outcome)
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
        """The finding recorded and answered by the policy; once the job is stopping
        (a signal) only recorded: nothing is restarted into a stop."""
        finding_id = self.store.add_finding(finding)
        self.on_update(finding)
        self._judge.note(finding)  # its fault's symptoms on the hosts are not new faults
        if self._stop is not None:
            return
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
        if intake is not None:
            self._detect(intake.frames(hosts=self.layout.nnodes), intake.take_medians())
        for finding in self.inbox() if self.inbox is not None else ():
            if off_the_job(finding, self.layout):
                self.store.add_finding(finding)
                self.on_update(finding)
            else:
                self._answer(finding)

    def _detect(self, frames: list[Frame], medians: list[HostMedians]) -> None:
        """The ranks' telemetry reduced on the hosts: stored and judged as in job recovery
        (``ReducedJudge``, the hosts' ``medians`` compared with each other); each finding
        is on its rank or node and answered by the policy (the built-in one notes a
        non-finite loss; a finding it has no rule for is recorded only)."""
        for frame in job_frames(frames):
            self.on_job_frame(frame)
        for finding in self._judge.judge(frames, self.clock(), medians):
            self._answer(finding)

    def _joined(self, agent: AgentState) -> None:
        if is_spare(agent):
            self._spare_joined(agent)
            return
        held = self._by_node.get(agent.node_rank)
        if held is not None and held.agent == agent.agent and agent.agent in self.adopting:
            replicaresume.adopt(self, held, agent)  # this controller restarted
            return
        if self.phase is Phase.RUNNING and held is not None and held.agent != agent.agent:
            why = f"node rank {agent.node_rank} is held by {held.agent} in this job"
            self.members.fence(agent.agent, why, key="refused")
            self._event(f"agent:{agent.agent}", Phase.EXITED, host=agent.host, reason=why)
            return
        self._by_node[agent.node_rank] = agent
        self.on_joined(agent)
        self._event(f"agent:{agent.agent}", Phase.RUNNING, host=agent.host, node=agent.node_rank)

    def _spare_joined(self, agent: AgentState) -> None:
        """A spare admitted; a fenced host's agent joining again as one
        (``rejoined_from``) only when it says its ranks ended; one on an evicted host
        only when it says ``readmit`` (``eviction.spare_refusal``)."""
        why = spare_refusal(agent, self._evicted)
        if why is not None:
            self.members.fence(agent.agent, why, key="refused")
            self._event(f"agent:{agent.agent}", Phase.EXITED, host=agent.host, reason=why)
            return
        self._spares.join(agent)
        detail = spare_detail(agent, self._evicted)
        self._event(f"agent:{agent.agent}", Phase.RUNNING, host=agent.host, spare=True, **detail)

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
            self.launcher.exited(report.agent, rank, code, attempt, ended_ago_s(body))
        elif report.kind == "samples":
            self._host_samples(report)
        elif report.kind == HOST_FINDINGS:
            self._host_findings(report)
        elif report.kind == "leaving":
            cause = str(body.get("cause", "a signal"))
            self._event(f"agent:{report.agent}", Phase.EXITED, reason=f"{cause} to the agent")
            if self._stop is None and not self._drain(report.agent, cause):
                self._stop = f"{cause} to the agent {report.agent}"
                self._stop_grace = leaving_grace(self.grace_s, body.get("grace_s"))
        elif report.kind == "outcome":
            self.on_update(report)

    def _host_findings(self, report: AgentReport) -> None:
        """What an agent's judge of its ranks found: checked (``host_findings``) and
        answered unless another detector found it already. (Replicas restart apart, so
        there is no one attempt to hold it to: the agent's judge starts afresh with each
        newer attempt of its ranks.)"""
        node = node_rank_of(report.agent, self._by_node)
        if node is None:
            return
        _, found = host_findings(report.body, report.agent, node, self.layout, self.clock())
        for finding in self._judge.once(found):
            self._answer(finding)

    def _host_samples(self, report: AgentReport) -> None:
        """A host's samples: stored; its word on its ranks' processes (stopped, or running
        again) given to the launcher, where the supervisor's looks read it; read by the
        host rules (an XID, an ECC error, a thermal throttle is a finding on the rank
        using the GPU, or on the node), whose findings are answered."""
        samples = report_samples(report)
        if samples is None:
            return
        self.store.add_samples(samples)
        self.on_samples(samples)
        looks = [s for s in samples if s.name == STOPPED and s.labels.get("rank", "").isdigit()]
        for look in looks:
            rank, generation = int(look.labels["rank"]), look.labels.get("attempt", "")
            if generation.isdigit():
                self.launcher.stopped(report.agent, rank, int(generation), look.value > 0)
        for finding in self._host_rules.findings(samples):
            self._answer(finding)

    # ---- the runtime the remediator executes through ------------------------------------
    def execute(self, action: Action) -> Outcome:
        """Runtime protocol: an eviction of a node's host (``node:nodeN``) is the
        coordinator's (a spare host takes its node rank); every other action is the
        supervisor's. Nothing acts before the job started or once it ended."""
        now = self.clock()
        if self.supervisor is None or self.phase is not Phase.RUNNING:
            why = f"the job is not running ({self.phase.value})"
            return Outcome(action, OutcomeStatus.SKIPPED, why, now)
        if action.kind is not ActionKind.EVICT:
            return self.supervisor.execute(action)
        held = held_node(action.target, self._by_node)
        if held is None:
            why = f"no agent of the job on {action.target}: nothing to evict"
            return Outcome(action, OutcomeStatus.SKIPPED, why, now)
        node, agent = held
        if agent.agent in self.members.fenced:
            return Outcome(action, OutcomeStatus.SKIPPED, "the host is out of the job already", now)
        self._event(f"agent:{agent.agent}", Phase.EVICTED, host=agent.host, cause=action.reason)
        cause = eviction_cause(agent, node, action.reason)
        self._evicted.setdefault(agent.host, cause)  # out until an operator readmits it
        status, why = self._take_over(node, cause, lost=False)
        if status is OutcomeStatus.FAILED:
            self._end(Phase.FAILED, why)
        return Outcome(action, status, why, self.clock())

    def _host_lost(self, gone: AgentLost) -> None:
        """A host lost: fenced, its ranks ended, its node rank given to a spare on which
        only its replicas restart (they catch up from a healthy one)."""
        held = self._by_node.get(gone.node_rank)
        if held is None or held.agent != gone.agent:  # a spare, or no node rank's host
            self._spares.drop(gone.agent)
            self._event(f"agent:{gone.agent}", Phase.EVICTED, host=gone.host, spare=True)
            return
        node = gone.node_rank
        finding = gone.finding()
        finding_id = self.store.add_finding(finding)
        self.on_update(finding)
        self._event(f"agent:{gone.agent}", Phase.EVICTED, host=gone.host, node=node)
        reason = f"host {gone.host} (node rank {node}) was lost"
        status, why = self._take_over(node, reason, lost=True)
        self._outcome(finding_id, status, why)
        if status is OutcomeStatus.FAILED:
            self._end(Phase.FAILED, why)

    def _drain(self, agent: str, cause: str) -> bool:
        """An agent that left on its own signal: a spare is dropped (the job goes on); a
        node rank's host, with a spare waiting, is drained as a lost host is replaced
        (``_take_over``: its ranks ended, told it was drained, only its replicas restart
        on the spare and catch up from a healthy one; no checkpoint is needed), recorded
        as an ``evict`` action with the reason. False: no spare (the job stops)."""
        if self._spares.drop(agent):
            self.members.fence(agent, f"{cause} to the spare {agent}", key="drained")
            return True
        node = next((n for n, a in self._by_node.items() if a.agent == agent), None)
        if (
            node is None
            or self.supervisor is None
            or self.phase is not Phase.RUNNING
            or agent in self.members.fenced
            or not self._spares.ready()
        ):
            return False
        decided = self.clock()
        reason = f"host {self._by_node[node].host} left on {cause}"
        status, why = self._take_over(node, reason, lost=False, drained=True)
        why_moved = f"{reason} (agent {agent}, node rank {node})"
        action = Action(ActionKind.EVICT, f"node:node{node}", why_moved, f"drain:{agent}")
        outcome = Outcome(action, status, why, self.clock())
        self.store.add_outcome(outcome, None, False, decided)
        self.on_update(outcome)
        if status is OutcomeStatus.FAILED:
            self._end(Phase.FAILED, why)
        return True

    def _take_over(
        self, node: int, reason: str, lost: bool, drained: bool = False
    ) -> tuple[OutcomeStatus, str]:
        """The host of node rank ``node`` out of the job (lost, or evicted), fenced: its
        ranks count as ended, its node rank is given to a spare on which only its replicas
        restart (they catch up from a healthy one). With no spare its replicas end and the
        others go on. Returns the outcome's status and what was done (FAILED: the spare
        went away too, and the job cannot go on: the caller ends it)."""
        assert self.supervisor is not None
        agent = self._by_node[node].agent
        ended = self.launcher.host_lost(agent)  # exits the supervisor reads next
        spare = self._spares.take_over(self._by_node, node, reason, lost, drained=drained)
        if spare is None:  # their exits drop their replicas; nothing restarts them
            self._on_lost_hosts.update(ended)
            return (
                OutcomeStatus.DONE,
                f"no spare host: the replicas of node rank {node} are lost; the others go on",
            )
        self.launcher.place(node, spare.agent)
        self.on_joined(spare)  # the replaced host's alerts are no longer node rank node's
        try:
            moved = self.supervisor.evict(
                f"node{node}", f"{reason}: moved to the spare {spare.agent}"
            )
        except LaunchError as exc:  # the spare went away between its hello and now
            why = f"node rank {node} could not restart on the spare {spare.agent}: {exc}"
            return OutcomeStatus.FAILED, why
        source = self.supervisor.quorum.current.source
        return OutcomeStatus.DONE, (
            f"node rank {node} moved to the spare {spare.agent} on {spare.host}; "
            f"replicas {moved} restarted there, catching up from replica {source}"
        )

    def _end(self, phase: Phase, reason: str, grace_s: float | None = None) -> Phase:
        """Ends the job: the supervisor's ranks and quorum (its store closed), then every
        agent is told to stop (ending what it runs), the ranks given ``grace_s`` (None:
        the whole grace period). ``reason`` empty: the supervisor recorded the end
        itself."""
        grace = self.grace_s if grace_s is None else grace_s
        supervisor = self.supervisor
        if supervisor is not None:
            if supervisor.finished:
                supervisor.stop_all(0.0)
            else:
                supervisor.stop(reason, grace)
                reason = ""  # recorded by the supervisor's stop
            self._record(supervisor.settle())  # what is left of its events
            for outcome in supervisor.outcomes():  # commands the end cut short
                self.store.add_outcome(outcome, None, False, outcome.time)
                self.on_update(outcome)
        self.phase = phase
        for agent in self.members.alive():
            self.members.send(agent.agent, "stop", {"grace_s": grace})
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
