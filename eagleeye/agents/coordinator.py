"""The controller's job loop across hosts, synchronous recovery (``--recovery job``).

It waits for one agent per node rank, launches the job through them (the agent of node
rank 0 names ``MASTER_ADDR``, the controller picks ``MASTER_PORT`` per attempt), and
records every launch, exit, finding and action in the run store. Every finding goes
through the remediation policy (``Remediator``), which decides the actions and, unless
it is a dry run, has the coordinator execute them (``execute``, the runtime of a job
across hosts): a restart of the whole job on every agent, within the restart budget; an
eviction of a host (fenced for good, ``Membership.fence``: a spare host, an agent
admitted with ``--spare`` (``eagleeye.agents.spares``), takes its node rank and the job
restarts on the new set of hosts as the next attempt; with no spare the job stops); a
notice, logged. Other actions are decided and skipped with the reason. The first failed
rank of an attempt is a ``process_exit`` finding; when no restart follows it (a dry run,
a policy without one) the job fails, as ``eagleeye run``'s does; the exits that follow
it in the same attempt are its collateral. An agent lost (``Membership.lost``) is a
``host_lost`` finding, answered as an eviction (a spare takes its place, else the job
stops and the other agents' ranks are ended: nothing is restarted onto a host that is
gone); when its link comes back, its agent ends its ranks and joins again as a spare
under the new name its stop gives (with snapshots too: its holder ends with its ranks).
An evicted host (suspected hardware) stays out: its agent ends, and a spare on that host
is refused unless it says ``readmit`` (``eagleeye agent --spare --readmit``, once its
hardware is checked). Every rank exiting 0 ends the job as succeeded. The
samples the agents forward from their hosts' sources are stored and read by the host
rules (an XID, an ECC error, a thermal throttle on the rank using the GPU). The ranks'
telemetry arrives reduced on the hosts (``SummaryIntake``) and is judged by
``reduced_detectors`` (``eagleeye.agents.judging``, shared with replica recovery). A hung
rank is judged from its host's word: a stopped rank (``StoppedRankHang``), a rank blocked
outside the collective the others wait in (``CollectiveWaitHang``: the launch carries the
hang limits the agents time their progress reports from). Before a hang is answered, each
agent of the job reads its ranks' stacks (``eagleeye.agents.hangstacks``): they are stored
with the finding, each naming its host, and the policy's action waits for them or
``stack_wait_s``, whichever comes first (a rank whose agent did not answer is recorded
without a stack, and why).
Findings from outside (Alertmanager's webhook, ``inbox``) placed
on the job's ranks or nodes are answered the same way; one on a host the job does not
run on is recorded only. A stop (a signal to the controller or an agent) asks the loops
for a checkpoint first when there is a grace period. An agent of a node rank that leaves
on its own signal (``leaving``: a scheduler's preemption, a node drain) while a spare
waits is drained instead of stopping the job (``_drain``): the checkpoint first, as for a
stop, when its grace period allows; then, as for a lost host, the spare takes its node
rank and every host restarts as the next attempt (from that checkpoint, which the ranks
load), recorded as an ``evict`` action with the reason. The leaving host is no suspect:
its agent ends as told (``drained``), and a spare on that host is admitted later without
``readmit``. A spare that leaves is dropped, and the job goes on. Like a lost host's
replacement, a drain is no decision of the policy (a dry run drains too): the host is
going either way. With no spare, or no restart left, the job stops as on a stop request.
With ``snapshots`` on, every launch carries the ring of the agents' snapshot holders
(``eagleeye.agents.snapshots``); when a spare takes a node rank, its holder takes that
node's place in the ring the restart carries. With a ``journal`` (the run store's,
``eagleeye.agents.resume``) the state a restarted controller needs is written before
every launch and end, and after each poll in which ranks exited; a controller restarted
on the run (``resume.restore``) adopts the agents' running ranks as they say ``hello``
again (``eagleeye.agents.adoption``).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from collector.types import Frame, Sample, Subject
from detectors.progress import HangLimits
from detectors.types import Finding, Severity
from eagleeye.agents.adoption import adopt
from eagleeye.agents.eviction import (
    HostRules,
    eviction_cause,
    held_node,
    off_the_job,
    readmit_refusal,
    report_samples,
    spare_detail,
    spare_refusal,
)
from eagleeye.agents.graceful import GraceWindow, leaving_grace, stop_grace
from eagleeye.agents.hangstacks import STACK_WAIT_S, STACKS, StackGather
from eagleeye.agents.hostjudge import HOST_FINDINGS
from eagleeye.agents.intake import SummaryIntake
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
    first_ended_first,
)
from eagleeye.agents.snapshots import ring_of
from eagleeye.agents.spares import NO_HOLDER_REFUSAL, Spares, is_spare
from eagleeye.agents.stopped import StoppedRankHang
from eagleeye.agents.waits import CollectiveWaitHang, limits_body
from eagleeye.errors import EagleEyeError
from eagleeye.ingest import ingest_samples
from eagleeye.stacks import HangStacks
from eagleeye.stopping import EVENT_LISTENING, pace_known, request_step, typical_step_s
from eagleeye.store import RunStore
from ft_runtime.layout import JobLayout
from ft_runtime.types import Action, ActionKind, LifecycleEvent, Outcome, OutcomeStatus, Phase
from remediation.policy import Policy, cluster_restart_policy
from remediation.remediator import Decision, Remediator

log = logging.getLogger(__name__)


@dataclass
class JobCoordinator:
    """Args:
    members: the agents' membership.
    layout: the job's layout (one agent per node rank).
    store: the run store.
    max_restarts: the job's restart budget.
    master_port: the port of rank 0's store for an attempt.
    on_update: called with every event, finding and outcome (the console).
    policy: the remediation policy its findings go through.
    dry_run: decide and record only; None takes the policy's (a dry run unless it says
        otherwise), as ``eagleeye run`` without ``--remediate``.
    inbox: findings from outside (Alertmanager's webhook), taken at every poll.
    on_samples: the hosts' samples, as they arrive (the exporter).
    on_job_frame: the job's frame of each step (the exporter's steps).
    on_joined: every agent admitted for a node rank, or a spare given one (where the
        webhook places a host's alerts).
    """

    members: Membership
    layout: JobLayout
    store: RunStore
    max_restarts: int = 3
    master_port: Callable[[int], int] = lambda attempt: 29500 + attempt
    on_update: Callable[[object], None] = lambda item: None
    clock: Callable[[], float] = time.time
    attempt: int = 0
    phase: Phase = Phase.PRE_CHECK
    _by_node: dict[int, AgentState] = field(default_factory=dict)
    _succeeded: set[int] = field(default_factory=set)
    _failed_attempts: set[int] = field(default_factory=set)
    _stop: str | None = None
    _host_rules: HostRules = field(default_factory=HostRules)
    _judge: ReducedJudge = field(init=False)  # the reduced telemetry's detectors
    intake: SummaryIntake | None = None  # the host summaries (made with the coordinator)
    grace_s: float = 0.0  # a stop's grace period: a checkpoint first, then this long to end
    _stopping: str | None = None  # why the job is being stopped (its ranks' exits are no failure)
    _listening: set[int] = field(default_factory=set)  # ranks whose loop saves when asked
    _saved: set[int] = field(default_factory=set)  # ranks that saved since the stop's request
    _newest_step: int | None = None
    _stop_grace: float | None = None  # an agent leaving gives no more than its own grace
    _step_times: deque[float] = field(default_factory=lambda: deque(maxlen=32))
    policy: Policy = field(default_factory=cluster_restart_policy)
    dry_run: bool | None = None
    inbox: Callable[[], list[Finding]] | None = None
    on_samples: Callable[[list[Sample]], None] = lambda samples: None
    on_job_frame: Callable[[Frame], None] = lambda frame: None
    on_joined: Callable[[AgentState], None] = lambda agent: None
    remediator: Remediator = field(init=False)
    _done_keys: set[str] = field(default_factory=set)
    snapshots: bool = False  # every host's snapshot holder in one ring, backing up across
    _ring: str | None = None
    _spares: Spares = field(init=False)  # spare hosts waiting for a node rank
    _stops: StoppedRankHang = field(init=False)  # the attempt's stopped ranks (hangs)
    hang: HangLimits = field(default_factory=HangLimits)  # --hang-k, --hang-min-silence-s
    _waits: CollectiveWaitHang = field(init=False)  # ranks blocked while others wait (hangs)
    journal: Callable[[JobCoordinator], None] = lambda job: None  # written ahead of acting
    launch_body: dict[str, object] = field(default_factory=dict)  # the current attempt's
    restored: bool = False  # restarted from the run store: the job runs, agents come back
    _exits_seen: set[tuple[int, int]] = field(default_factory=set)  # (attempt, rank) handled
    _journal_due: bool = False  # ranks' exits since the journal was last written
    _evicted: dict[str, str] = field(default_factory=dict)  # host -> why it was evicted
    stack_wait_s: float = STACK_WAIT_S  # a hang's action waits this long at most for stacks
    _gather: StackGather = field(init=False)  # asks the agents for their ranks' stacks
    _held: list[AgentState | AgentReport] = field(default_factory=list)  # came meanwhile
    _leaving: _Leaving | None = None  # a node rank's agent that left on a signal, to drain

    def __post_init__(self) -> None:
        self._spares = Spares(self.members)
        self._gather = StackGather(self.members, self.stack_wait_s)
        self._judge = ReducedJudge(self.store, self.layout)
        self._stops = StoppedRankHang(self.layout.world_size)
        self._waits = CollectiveWaitHang(self.layout.world_size, self.hang)
        if self.intake is None:
            self.intake = SummaryIntake(self.layout, clock=self.clock)
        self.members.intake = self.intake
        self.remediator = Remediator(self.policy, self, self.dry_run, clock=self.clock)

    def request_stop(self, cause: str) -> None:
        """Ends the job from outside (a signal): every agent stops its ranks, after a
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
        if self.snapshots and not self.restored:
            try:
                self._ring = self._holders_ring()
            except EagleEyeError as exc:
                return self._end(Phase.FAILED, str(exc))
        if not self.restored:
            self._launch("launch")
        end = self.clock() + limit_s
        while self.phase is Phase.RUNNING and self.clock() < end:
            if self._stop is not None:
                return self._stop_job(f"stopped by {self._stop}")
            if self._leaving is not None:
                self._drain(self._leaving)
            self._poll()
            for gone in self.members.lost():
                self._host_lost(gone)
        if self.phase is Phase.RUNNING:
            self._end(Phase.FAILED, "time limit")
        return self.phase

    def _stop_job(self, reason: str) -> Phase:
        """Ends the job on a stop request; with a grace period and loops that listen,
        every agent is first asked for a checkpoint at one step (ranks in lockstep leave
        their loops together), and the stop waits until each listening rank has saved or
        half the grace period is spent. The ranks get what is left to end."""
        self._stopping = reason
        window = GraceWindow.start(stop_grace(self.grace_s, self._stop_grace), self.clock)
        self._checkpoint_first(reason, window, lambda: False)
        return self._end(Phase.FAILED, reason, grace_s=window.left())  # None: the agents'

    def _checkpoint_first(
        self, reason: str, window: GraceWindow, cut_short: Callable[[], bool]
    ) -> None:
        """With a grace period and loops that listen: every agent asked for a checkpoint
        at one step, waited for until each listening rank saved, ``cut_short()`` or half
        the grace period is spent (``_stopping`` set: the ranks' exits are no failure)."""
        if window.grace_s <= 0 or not self._listening:
            return
        # the ranks leave their loops together only at a step named to them all: a stop
        # that came before any step reached the controller (the ranks listen from their
        # first step; the hosts' summaries follow) waits for a few steps' times, a quarter
        # of the grace period at most. Asked "at once", each rank read the request at a
        # step of its own and they waited on each other's collectives to the end; asked
        # on the first step's time alone (warm-up), they had passed the step named.
        window.wait(self._poll, lambda: pace_known(self._step_times) or cut_short(), share=0.25)
        step = request_step(self._newest_step, typical_step_s(self._step_times))
        self._event("job", Phase.RUNNING, checkpoint_requested=step, reason=reason)
        self._saved.clear()
        for agent in self.members.alive():
            self.members.send(agent.agent, "checkpoint", {"cause": reason, "step": step})
        window.wait(self._poll, lambda: self._listening <= self._saved or cut_short())

    def _left(self, agent: str, cause: str, grace_s: float) -> None:
        """An agent left on its own signal: a spare is dropped (the job goes on); a node
        rank's host is drained when a spare waits and a restart is left (``_drain``, from
        the job's loop); else the job stops, after a checkpoint within ``grace_s``."""
        if self._spares.drop(agent):
            self.members.fence(agent, f"{cause} to the spare {agent}", key="drained")
            return
        node = node_rank_of(agent, self._by_node)
        if (
            node is not None
            and self._leaving is None
            and self.phase is Phase.RUNNING
            and self.attempt < self.max_restarts
            and self._spares.ready()
        ):
            state = self._by_node[node]
            self._leaving = _Leaving(agent, state.host, node, cause, grace_s)
            self._stopping = f"host {state.host} left on {cause}"  # its exits: no failure
            return
        self._stop = f"{cause} to the agent {agent}"
        self._stop_grace = grace_s

    def _drain(self, leaving: _Leaving) -> None:
        """A node rank's agent left on a signal with a spare waiting: every host asked for
        a checkpoint first (within the agent's grace period, as for a stop); then its
        ranks are ended (its agent fenced, told it was drained), the spare takes its node
        rank and every host restarts as the next attempt (``_replace``, the lost host's
        path); recorded as an ``evict`` action with the reason. A stop asked meanwhile
        wins (the job's loop stops it). Nothing else acts meanwhile (``execute``)."""
        reason = f"host {leaving.host} left on {leaving.cause}"
        window = GraceWindow.start(leaving.grace_s, self.clock)
        self._checkpoint_first(reason, window, lambda: self._stop is not None)
        self._stopping = None
        self._leaving = None
        if self._stop is not None or self.phase is not Phase.RUNNING:
            return
        action = Action(
            ActionKind.EVICT,
            f"node:node{leaving.node}",
            f"{reason} (agent {leaving.agent}, node rank {leaving.node})",
            f"drain:{leaving.agent}",
        )
        decided = self.clock()
        done = self._replace(leaving.agent, leaving.node, reason, drained=True)
        if done is None:
            return  # out of the job already (lost meanwhile): answered there
        status = OutcomeStatus.DONE if self.phase is Phase.RUNNING else OutcomeStatus.FAILED
        outcome = Outcome(action, status, done, self.clock())
        self.store.add_outcome(outcome, None, False, decided)
        self.on_update(outcome)

    def _poll(self) -> None:
        held, self._held = self._held, []  # what came while a hang's stacks were awaited
        for got in first_ended_first([*held, *self.members.poll(timeout_s=0.0 if held else 0.05)]):
            if isinstance(got, AgentState):
                self._joined(got)
            elif isinstance(got, AgentReport):
                self._report(got)
        assert self.intake is not None
        self._detect(self.intake.frames(hosts=self.layout.nnodes))
        for finding in self.inbox() if self.inbox is not None else ():
            self._from_outside(finding)
        if self._journal_due:
            self._journal_due = False
            self.journal(self)

    def _from_outside(self, finding: Finding) -> None:
        """A finding from outside (an alert): answered when it is placed in the job; one
        on a host the job does not run on is recorded, and nothing acts on it."""
        if off_the_job(finding, self.layout):
            self.store.add_finding(finding)
            self.on_update(finding)
            return
        self._answer(finding)

    def _detect(self, frames: list[Frame]) -> None:
        """The ranks' telemetry reduced on the hosts: stored (outlier rows, the job's and
        the outstanding hosts' frames) and judged by the detectors (``ReducedJudge``)."""
        now = self.clock()
        for frame in job_frames(frames):
            assert frame.step is not None
            self._stops.job_step(frame, now)
            self._waits.job_step(frame, now)
            self._newest_step = max(self._newest_step or 0, frame.step)
            step_time = frame.values.get("step_time.median")
            if step_time is not None:
                self._step_times.append(step_time)
            self.on_job_frame(frame)
        assert self.intake is not None
        found = self._judge.judge(frames, now, self.intake.take_medians())
        found += self._stops.poll(now)
        found += self._waits.poll(now)
        for finding in found:
            self._answer(finding)

    def _answer(self, finding: Finding) -> None:
        """A finding: stored, shown, and answered by the policy (its decisions stored and
        shown; executed through ``execute`` unless a dry run). A hang's stacks are read
        first, before anything acts on its ranks."""
        finding_id = self.store.add_finding(finding)
        self.on_update(finding)
        self._judge.note(finding)  # its fault's symptoms on the hosts are not new faults
        if finding.kind == "hang":
            self._capture_stacks(finding, finding_id)
        for decision in self.remediator.handle(finding):
            self._decided(decision, finding_id)

    def _capture_stacks(self, finding: Finding, finding_id: int) -> None:
        """Every rank's stacks, read by its host's agent (or why none were), stored with
        the finding as ``eagleeye run`` stores them, each naming its host. What the
        agents sent meanwhile is handled at the next poll, in order."""
        got = self._gather.gather(self._by_node, self.layout)
        self._held.extend(got.held)
        now = self.clock()
        for stack in got.stacks:
            self.store.add_stack(
                now,
                finding_id,
                stack.rank,
                attempt=self.attempt,
                pid=stack.pid,
                method=stack.method,
                state=stack.state,
                text=stack.text,
                host=stack.host,
            )
        self.on_update(HangStacks(finding, got.stacks))

    def _decided(self, decision: Decision, finding_id: int | None) -> None:
        self.store.add_outcome(decision.outcome, finding_id, decision.dry_run, decision.decided_at)
        self.on_update(decision)

    def _joined(self, agent: AgentState) -> None:
        if is_spare(agent):
            self._spare_joined(agent)
            return
        held = self._by_node.get(agent.node_rank)
        if self.phase is Phase.RUNNING and held is not None and held.agent == agent.agent:
            adopt(self, held, agent)  # its link came back, or this controller restarted
            return
        if self.phase is Phase.RUNNING and held is not None and held.agent != agent.agent:
            why = f"node rank {agent.node_rank} is held by {held.agent} in this job"
            self.members.fence(agent.agent, why, key="refused")  # it takes no host's place
            self._event(f"agent:{agent.agent}", Phase.EXITED, host=agent.host, reason=why)
            return
        self._by_node[agent.node_rank] = agent
        self.on_joined(agent)
        self._event(f"agent:{agent.agent}", Phase.RUNNING, host=agent.host, node=agent.node_rank)

    def _launch(self, kind: str) -> None:
        master = self._by_node[0]
        body = {
            "attempt": self.attempt,
            "master_addr": str(master.info.get("address") or master.host),
            "master_port": self.master_port(self.attempt),
            "nnodes": self.layout.nnodes,
            "nproc_per_node": self.layout.nproc_per_node,
        }
        self.phase = Phase.RUNNING
        self._event("job", Phase.LAUNCH, **body)
        if self._ring is not None:
            body["snapshots"] = self._ring
        body["progress"] = limits_body(self.hang)  # the agents report stalls from these
        self.launch_body = dict(body)
        self.journal(self)  # before any agent acts on it
        for node, agent in self._by_node.items():  # a spare learns its node rank here
            self.members.send(agent.agent, kind, {**body, "node_rank": node})

    def _report(self, report: AgentReport) -> None:
        body = report.body
        if report.kind == "launched":
            state = self.members.agents.get(report.agent)
            host = state.host if state is not None else report.agent
            detail = {"agent": report.agent, "host": host, **body}
            self._event(f"rank:{body['rank']}", Phase.LAUNCH, **detail)
        elif report.kind == "exit":
            self._exit(report.agent, int(body["rank"]), int(body["code"]), int(body["attempt"]))
        elif report.kind == "samples":
            self._host_samples(report)
        elif report.kind == "events":
            self._rank_events(report)
        elif report.kind == "progress":
            self._rank_progress(report)
        elif report.kind == HOST_FINDINGS:
            self._host_findings(report)
        elif report.kind == "leaving":
            cause = str(report.body.get("cause", "a signal"))
            self._event(f"agent:{report.agent}", Phase.EXITED, reason=f"{cause} to the agent")
            if self._stop is None:
                grace = leaving_grace(self.grace_s, report.body.get("grace_s"))
                self._left(report.agent, cause, grace)
        elif report.kind == "outcome":
            self.on_update(report)
        elif report.kind == STACKS:  # after its hang was acted on
            self._gather.late(report)

    def _host_findings(self, report: AgentReport) -> None:
        """What an agent's judge of its ranks found: checked (``host_findings``), and
        answered when it is of this attempt and no other detector found it already."""
        node = node_rank_of(report.agent, self._by_node)
        if node is None:
            return
        attempt, found = host_findings(report.body, report.agent, node, self.layout, self.clock())
        if attempt == self.attempt:
            for finding in self._judge.once(found):
                self._answer(finding)

    def _host_samples(self, report: AgentReport) -> None:
        """A host's samples: stored, and read by the host rules (an XID, an ECC error, a
        thermal throttle is a finding on the rank using the GPU, or on the node)."""
        samples = report_samples(report)
        if samples is None:
            return
        self.store.add_samples(samples)
        self.on_samples(samples)
        self._stops.observe(samples, self.attempt, self.clock())
        self._waits.observe(samples, self.attempt, self.clock())
        for finding in self._host_rules.findings(samples):
            self._answer(finding)

    # ---- the runtime of a job across hosts (what the remediator executes) ----------------
    def execute(self, action: Action) -> Outcome:
        """Runtime protocol: a restart of the job on every agent (any restart: recovery is
        of the whole job), an eviction of a node's host (no spare host: the job stops), a
        notice (logged). Other kinds are skipped with the reason; nothing acts once the
        job has ended."""
        now = self.clock()
        if action.key in self._done_keys:
            return Outcome(action, OutcomeStatus.SKIPPED, "duplicate of an executed action", now)
        if action.kind is ActionKind.NOTIFY:
            self._done_keys.add(action.key)
            log.warning("eagleeye notice: %s", action.reason)
            return Outcome(action, OutcomeStatus.DONE, "logged", now)
        if action.kind not in (ActionKind.RESTART, ActionKind.EVICT):
            why = f"{action.kind.value} is not supported across hosts (recovery job)"
            return Outcome(action, OutcomeStatus.SKIPPED, why, now)
        if self.phase is not Phase.RUNNING:
            why = f"the job is not running ({self.phase.value})"
            return Outcome(action, OutcomeStatus.SKIPPED, why, now)
        if self._leaving is not None:
            why = f"{self._leaving.agent} is being drained to a spare (it left on a signal)"
            return Outcome(action, OutcomeStatus.SKIPPED, why, now)
        self._done_keys.add(action.key)
        if action.kind is ActionKind.EVICT:
            return self._evict(action, now)
        return self._restart(action, now)

    def _restart(self, action: Action, now: float) -> Outcome:
        """The whole job, on every agent, as the next attempt (within the budget)."""
        if self.attempt >= self.max_restarts:
            self._end(Phase.FAILED, f"the restart budget is spent ({action.reason})")
            return Outcome(action, OutcomeStatus.SKIPPED, "budget spent", now)
        self._next_attempt(action.reason)
        return Outcome(action, OutcomeStatus.DONE, "every agent restarted", self.clock())

    def _next_attempt(self, reason: str, **detail: object) -> None:
        """Every agent restarts its ranks as the next attempt (the detectors' new baseline)."""
        self.attempt += 1
        self._succeeded.clear()
        self._judge.reset()
        self._stops = StoppedRankHang(self.layout.world_size)
        self._waits = CollectiveWaitHang(self.layout.world_size, self.hang)
        self._event("job", Phase.RECOVERING, reason=reason, **detail)
        self._launch("restart")

    def _holders_ring(self) -> str:
        """The ring of the snapshot holders the agents of the node ranks declared."""
        return ring_of({n: str(a.info.get("holder") or "") for n, a in self._by_node.items()})

    def _evict(self, action: Action, now: float) -> Outcome:
        """A host whose GPU is beyond use (a fatal XID, an uncorrectable memory error):
        evicted. With no spare host to take its ranks, the job stops (a restart on the
        same GPU would fail again; a scheduler's requeue finds healthy hosts)."""
        held = held_node(action.target, self._by_node)
        if held is None:
            why = f"no agent of the job on {action.target}: nothing to evict"
            return Outcome(action, OutcomeStatus.SKIPPED, why, now)
        node, agent = held
        self._event(f"agent:{agent.agent}", Phase.EVICTED, host=agent.host, cause=action.reason)
        cause = eviction_cause(agent, node, action.reason)
        done = self._replace(agent.agent, node, cause)
        if done is not None:
            self._evicted.setdefault(agent.host, cause)  # out until an operator readmits it
        if done is None:
            return Outcome(action, OutcomeStatus.SKIPPED, "the host is out of the job already", now)
        return Outcome(action, OutcomeStatus.DONE, done, self.clock())

    def _rank_progress(self, report: AgentReport) -> None:
        """A stalled host's word on its ranks' progress (waiting in a collective, paused,
        running): stored, and judged with the job's steps (``CollectiveWaitHang``)."""
        samples = report_samples(report)
        if samples is None:
            return
        self.store.add_samples(samples)
        self._waits.observe(samples, self.attempt, self.clock())

    def _rank_events(self, report: AgentReport) -> list[Sample]:
        """The ranks' events an agent forwards as they are (checkpoints, faults, loops
        that listen for a checkpoint request): stored."""
        samples = report_samples(report)
        if samples is None:
            return []
        ingest_samples(self.store, samples)
        for sample in samples:
            rank = sample.labels.get("rank", "")
            if not rank.isdigit():
                continue
            if sample.name == EVENT_LISTENING and int(rank) not in self._listening:
                self._listening.add(int(rank))
                self._event(f"rank:{rank}", Phase.RUNNING, listening=True)
            elif sample.name == "event.checkpoint" and self._stopping is not None:
                self._saved.add(int(rank))
        return samples

    def _exit(self, agent: str, rank: int, code: int, attempt: int) -> None:
        if (attempt, rank) in self._exits_seen:  # reported, and declared again in a hello
            return
        self._exits_seen.add((attempt, rank))
        collateral = code != 0 and attempt in self._failed_attempts
        self._event(
            f"rank:{rank}", Phase.EXITED, agent=agent, exit_code=code, collateral=collateral
        )
        if attempt != self.attempt or self._stopping is not None:
            return  # a rank of an earlier attempt, or one the stop ends
        self._waits.exited(rank)
        if code == 0:
            self._succeeded.add(rank)
            self._journal_due = True  # written once a poll, not once an exit
            if len(self._succeeded) == self.layout.world_size:
                self._end(Phase.SUCCEEDED, "every rank exited 0")
            return
        if collateral:
            return
        self._failed_attempts.add(attempt)  # journaled by the restart or the end that follows
        spec = self.layout.rank(rank)
        finding = Finding(
            "process_exit",
            Subject(replica=spec.replica, rank=rank, node=spec.node),
            1.0,
            Severity.CRITICAL,
            self.clock(),
            None,
            {"exit_code": float(code), "attempt": float(attempt)},
            "process_exit",
        )
        self._answer(finding)
        if self.phase is Phase.RUNNING and self.attempt == attempt:
            # no restart followed (a dry run, a policy without one): as `eagleeye run`
            self._end(Phase.FAILED, f"rank {rank} exited {code} and no recovery was run")

    def _host_lost(self, gone: AgentLost) -> None:
        held = self._by_node.get(gone.node_rank)
        if held is None or held.agent != gone.agent:  # a spare, or no node rank's host
            self._spares.drop(gone.agent)
            self._event(f"agent:{gone.agent}", Phase.EVICTED, host=gone.host, spare=True)
            return
        finding = gone.finding()
        finding_id = self.store.add_finding(finding)
        self.on_update(finding)
        self._event(f"agent:{gone.agent}", Phase.EVICTED, host=gone.host, node=gone.node_rank)
        reason = f"host {gone.host} (node rank {gone.node_rank}) was lost"
        why = self._replace(gone.agent, gone.node_rank, reason, rejoin=True)
        if why is not None:
            self._outcome(finding_id, ActionKind.EVICT, OutcomeStatus.DONE, why)

    def _spare_joined(self, agent: AgentState) -> None:
        """A spare host admitted: it waits for a node rank. With snapshots on it must have
        declared its snapshot holder (it takes its node's place in the ring), else it is
        refused. A fenced host's agent joining again as a spare (``rejoined_from``) is
        admitted only when it says its ranks ended. A spare on a host evicted from this
        job (suspected hardware) is refused unless its hello says ``readmit`` (the
        operator's ``eagleeye agent --spare --readmit``)."""
        why = spare_refusal(agent, self._evicted)
        if why is not None:
            self.members.fence(agent.agent, why, key="refused")
            self._event(f"agent:{agent.agent}", Phase.EXITED, host=agent.host, reason=why)
            return
        if self.snapshots and not agent.info.get("holder"):
            self.members.fence(agent.agent, NO_HOLDER_REFUSAL, key="refused")
            self._event(
                f"agent:{agent.agent}",
                Phase.EXITED,
                host=agent.host,
                spare=True,
                reason=NO_HOLDER_REFUSAL,
            )
            return
        self._spares.join(agent)
        detail = spare_detail(agent, self._evicted)
        self._event(f"agent:{agent.agent}", Phase.RUNNING, host=agent.host, spare=True, **detail)

    def _replace(
        self, agent: str, node: int, reason: str, rejoin: bool = False, drained: bool = False
    ) -> str | None:
        """The host of ``node`` lost or evicted: fenced for good; the first spare alive
        takes its node rank and every host restarts as the next attempt (the ranks of the
        attempt that was running are ended), within the restart budget. With no spare, or
        no budget left, the job stops. With ``rejoin`` (a lost host, not an evicted one)
        and the job going on, the fenced host's stop names a new agent under which it
        joins again as a spare once its ranks ended (with snapshots too: its holder ends
        with its ranks, and the spare's holder starts fresh when it is given a node rank).
        An evicted host's stop says so (``evicted``): its agent stays out; a ``drained``
        one's says it was drained (its agent left on a signal). Returns what
        was done (None: the host was out of the job already, a second finding on it)."""
        held = self._by_node.get(node)
        if agent in self.members.fenced or held is None or held.agent != agent:
            return None
        budget = self.attempt < self.max_restarts
        spare = self._spares.take_over(
            self._by_node, node, reason, lost=rejoin, goes_on=budget, drained=drained
        )
        if spare is None:
            self._end(Phase.FAILED, reason)
            return "no spare host: stopped"
        if not budget:
            self._end(Phase.FAILED, f"{reason} and the restart budget is spent")
            return f"the spare {spare.agent} is left unused: the restart budget is spent; stopped"
        self.on_joined(spare)  # the replaced host's alerts are no longer node rank node's
        if self._ring is not None:  # the spare's holder takes the node's place in the ring
            self._ring = self._holders_ring()
        self._next_attempt(
            f"{reason}: node rank {node} moved to the spare {spare.agent}",
            node=node,
            spare=spare.agent,
            host=spare.host,
        )
        return (
            f"node rank {node} moved to the spare {spare.agent} on {spare.host}; "
            f"every host restarted as attempt {self.attempt}"
        )

    def _end(self, phase: Phase, reason: str, grace_s: float | None = None) -> Phase:
        self.phase = phase
        self.journal(self)
        body = {} if grace_s is None else {"grace_s": grace_s}
        for agent in self.members.alive():
            self.members.send(agent.agent, "stop", body)
        self._event("job", phase, reason=reason)
        return phase

    def _outcome(self, finding_id: int, kind: ActionKind, status: OutcomeStatus, why: str) -> None:
        now = self.clock()
        action = Action(kind, "job", why, f"{kind}:job:{self.attempt}")
        self.store.add_outcome(Outcome(action, status, why, now), finding_id, False, now)

    def _event(self, subject: str, phase: Phase, **detail: object) -> None:
        event = LifecycleEvent(subject, phase, self.clock(), self.attempt, detail)
        self.store.add_event(event)
        self.on_update(event)


@dataclass(frozen=True, slots=True)
class _Leaving:
    """A node rank's agent that left on its own signal, to be drained to a spare."""

    agent: str
    host: str
    node: int
    cause: str  # the signal's name
    grace_s: float  # what its grace period gives the checkpoint and the ranks


__all__ = ["JobCoordinator", "readmit_refusal"]
