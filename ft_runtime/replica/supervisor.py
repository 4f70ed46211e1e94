"""Replicas as the unit of failure: the supervisor of a replica-recovery job (TRANSOM's TOL).

A failed or hung rank costs only its replica: the quorum drops the replica (its epoch
breaks, so the survivors abort that exchange and carry on without it), the replica's other
ranks are stopped, and a restart (asked for through the control protocol) relaunches only
that replica, which catches up from a healthy peer. Each replica goes through
launch → pre_check → running → recovering → evicted, recorded as lifecycle events; a
restart budget per replica ends restart loops on a deterministic bug, and an evicted node
gets no more ranks (its replicas move to spare nodes). When a replica's budget is spent, or
fewer than the minimum replicas are left, the whole job restarts from its newest checkpoint
(the last resort). Checkpoint, rollback and skip_batch reach the ranks as commands through
the quorum's store (``ft_runtime.commands``) without blocking: ``execute`` returns a pending
Outcome and a later ``poll`` yields the final one (``outcomes()``). The quorum's
coordinator can be replaced by one that resumes from its membership log
(``restart_coordinator``).

The supervisor is composed, not derived: it is given a ``Launcher`` (``ft_runtime.launcher``)
that starts, signals and stops the ranks, and a ``QuorumService`` that decides membership.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from ft_runtime import procstat
from ft_runtime.launcher import Launcher, LocalLauncher, StopOnRequest
from ft_runtime.layout import RankSpec
from ft_runtime.membership import Membership
from ft_runtime.procstat import ProcSample
from ft_runtime.quorum import ENV_QUORUM, MembershipLog, QuorumService, StallReport
from ft_runtime.replica import config
from ft_runtime.replica.auth import ENV_REPLICA_SECRET
from ft_runtime.replica.inflight import Finished, InFlight, answer_json
from ft_runtime.replica.protocol import CHECKPOINT, ROLLBACK, Failed, Restored, Saved, Skipped
from ft_runtime.replica.state import ReplicaState
from ft_runtime.storehost import DetachedStore, StoreHost
from ft_runtime.supervisor import LaunchSpec
from ft_runtime.types import Action, ActionKind, LifecycleEvent, Outcome, OutcomeStatus, Phase

log = logging.getLogger(__name__)
Looks = dict[int, tuple[ProcSample | None, ProcSample | None]]
"""Per live rank: its previous and its current look (state, CPU time)."""
CONFIRM_S = 0.005
"""A rank found stopped is looked at once more this much later before it counts as hung."""


@dataclass
class _Rank:
    """The supervisor's bookkeeping of one rank's current process."""

    spec: RankSpec
    incarnation: int
    pid: int
    log_path: Path
    expected_stop: bool = False  # stopped on purpose: its exit is no failure
    exit_collected: bool = False  # its exit was seen: only then is it not live
    culprit: bool = False  # its failure (or hang) dropped the replica
    clean: bool = False  # it exited 0: trained to the end


class ReplicaSupervisor(StopOnRequest):
    """Owns the ranks of a job whose replicas fail, restart and rejoin independently.
    Not thread-safe: drive it from one thread.

    Args:
        launch: what to start.
        quorum: the membership service (started here).
        max_restarts: restart budget of each replica.
        clock: wall-clock time, seconds.
        max_job_restarts: budget of full-job restarts from the newest checkpoint, the last
            resort when a replica's budget is spent or too few replicas are left.
        command_timeout_s: how long a control command (checkpoint, rollback, skip_batch)
            waits for the replicas' answers before its outcome is failed.
        joiner_nice: how much lower a relaunched replica's ranks run until they caught up
            (0: not at all), so their start-up does not slow the replicas that train.
        straggler_factor: a replica the quorum finds stalled whose late ranks are all
            running (``ft_runtime.procstat``) is given up to this many stall limits before
            it counts as hung; a blocked rank counts at the limit, a stopped (SIGSTOP) one
            as soon as a member waits for it, limit or not.
        launcher: starts, signals and stops the ranks (default: on this machine).
        timer: monotonic seconds, for command deadlines.
    """

    launch: LaunchSpec

    def __init__(
        self,
        launch: LaunchSpec,
        quorum: QuorumService,
        max_restarts: int = config.MAX_RESTARTS,
        clock: Callable[[], float] = time.time,
        max_job_restarts: int = config.MAX_JOB_RESTARTS,
        command_timeout_s: float = config.COMMAND_TIMEOUT_S,
        joiner_nice: int = config.JOINER_NICE,
        straggler_factor: float = config.STRAGGLER_FACTOR,
        launcher: Launcher | None = None,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        self.launch = launch
        self.quorum = quorum
        self.max_restarts = max_restarts
        self.clock = clock
        self.launcher: Launcher = LocalLauncher(clock) if launcher is None else launcher
        self.max_job_restarts = max_job_restarts
        self.command_timeout_s = command_timeout_s
        self.joiner_nice = joiner_nice
        self.straggler_factor = straggler_factor
        self.attempt = -1
        self.restarts = 0
        self.job_restarts = 0
        self.phase = Phase.LAUNCH
        self.replicas = {r: ReplicaState() for r in range(launch.layout.replicas)}
        self.evicted_nodes: set[str] = set()
        self.store_host: StoreHost | DetachedStore | None = None
        self.no_restart: str | None = None  # a crash loop's reason, kept for the record
        # Variables of an attempt that only the caller knows (unused: ranks resume through
        # their replicas, or from the checkpoint the quorum's restart names).
        self.attempt_env: Callable[[int], Mapping[str, str]] = lambda attempt: {}
        # Ranks stopped on purpose right now (an injected slow fault's duty cycle): their
        # stopped state is no evidence of a hang.
        self.held: Callable[[], Collection[int]] = lambda: ()
        self.sleep: Callable[[float], None] = time.sleep  # the wait before a second look
        self._ranks: dict[int, _Rank] = {}
        self._looks: dict[int, ProcSample] = {}  # by pid: the last look at each rank
        self._woken: set[tuple[int, int]] = set()  # (pid, step) look_now woke the loop for
        self._lost: set[int] = set()
        self._events: list[LifecycleEvent] = []
        self._done_keys: set[str] = set()
        self._inflight = InFlight(command_timeout_s, timer)
        self._finished: list[Outcome] = []

    @property
    def incarnation(self) -> dict[int, int]:
        """Each replica's current incarnation."""
        return {r: s.incarnation for r, s in self.replicas.items()}

    @property
    def finished(self) -> bool:
        return self.phase in (Phase.SUCCEEDED, Phase.FAILED)

    # ---- launching ---------------------------------------------------------------------
    def start(self) -> None:
        self.attempt += 1
        if self.quorum.log is not None and self.quorum.store_address is None:
            # A coordinator with a log can restart: its store must not go down with it.
            self.store_host = StoreHost(self.quorum.host, self.launch.python)
            self.quorum.store_address = self.store_host.start()
        self.quorum.start()
        self._emit("job", Phase.LAUNCH, world_size=self.launch.layout.world_size)
        self._emit_membership(self.quorum.current)
        for replica in self.replicas:
            self._launch_replica(replica)
        self.phase = Phase.RUNNING

    def _set(self, replica: int, state: ReplicaState) -> None:
        self.replicas[replica] = state

    def _launch_replica(self, replica: int) -> None:
        state = self.replicas[replica]
        log_dir = Path(self.launch.log_dir) / f"replica-{replica}-{state.incarnation}"
        log_dir.mkdir(parents=True, exist_ok=True)
        specs = [self._placed(s) for s in self.launch.layout.ranks() if s.replica == replica]
        joiner = state.incarnation > 0 and replica not in self.quorum.healthy
        self._emit(f"replica:{replica}", Phase.LAUNCH, incarnation=state.incarnation)
        self._set(replica, state.with_phase(Phase.PRE_CHECK))
        argv = [self.launch.python or _python(), *self.launch.command]
        for spec in specs:
            env = {
                **self.launch.env,
                **self.launch.layout.environment(
                    spec, self.launch.master_addr, 0, state.incarnation, self.launch.run_id
                ),
                "EAGLEEYE_NODE": spec.node,
                ENV_QUORUM: self.quorum.address,
                ENV_REPLICA_SECRET: self.quorum.secret,
            }
            log_path = log_dir / f"rank-{spec.rank}.log"
            nice = self.joiner_nice if joiner else 0
            pid = self.launcher.start(spec, state.incarnation, argv, env, log_path, nice)
            self._ranks[spec.rank] = _Rank(spec, state.incarnation, pid, log_path)
            self._emit(
                f"rank:{spec.rank}",
                Phase.LAUNCH,
                node=spec.node,
                replica=replica,
                pid=pid,
                attempt=state.incarnation,  # the rank's own attempt: its samples carry it
            )
        # Pre-check: the processes started on nodes that are not evicted.
        alive = all(self.launcher.running(s.rank) for s in specs)
        self._emit(f"replica:{replica}", Phase.PRE_CHECK, passed=alive, nodes=_nodes(specs))
        # A relaunched replica runs once the quorum admits it; after a job restart every
        # replica is a member at once.
        if state.incarnation == 0 or replica in self.quorum.healthy:
            self._set(replica, self.replicas[replica].with_phase(Phase.RUNNING))
            self._emit(f"replica:{replica}", Phase.RUNNING, incarnation=state.incarnation)

    def _placed(self, spec: RankSpec) -> RankSpec:
        if spec.node not in self.evicted_nodes:
            return spec
        return dataclasses.replace(spec, node=f"spare{spec.node_rank}")

    # ---- watching ----------------------------------------------------------------------
    def poll(self) -> list[LifecycleEvent]:
        """Collects exits, drops dead and hung replicas from the quorum, admits joiners,
        and collects the answers to commands in flight. Never waits on a rank (only
        ``CONFIRM_S`` for a second look at one found stopped)."""
        if self.phase is Phase.RUNNING and self.store_host and not self.store_host.alive:
            self._store_lost()  # before the exits it caused, whose handling needs the store
            return self._take_events()
        for ended in self.launcher.exits():
            rank = self._ranks.get(ended.rank)
            if rank is None or ended.generation != rank.incarnation:
                continue
            rank.exit_collected = True
            if not rank.expected_stop:
                self._on_exit(rank, ended.code, ended.time)
        try:
            report = self.quorum.stalled()
        except RuntimeError as exc:  # the coordinator lost its store connection
            if self._store_gone():
                self._store_lost()  # a new coordinator would wait out its connect timeout
                return self._take_events()
            self.restart_coordinator(f"coordinator failed: {exc}")
            report = StallReport()
        looks = self._look_at_ranks()
        if self._suspended(looks):
            report = StallReport()  # the whole job stands still on purpose: no hang
        stopped = self._stopped_ranks(report, looks)
        for replica in sorted({*report.replicas, *(self._replica(r) for r in stopped)}):
            mine = [r for r in stopped if self._replica(r) == replica]
            if mine:  # evidence: a stopped process does not arrive, whatever the limit
                reason = "hung: stopped (SIGSTOP) while the others wait in the exchange"
            elif self._straggling(replica, report, looks):
                continue  # running, only slow: a busy machine, not a hang (yet)
            elif self._exiting(replica, report, looks):
                continue  # dead, its exit not collected yet: the next poll names the cause
            else:
                reason = "hung: never entered the exchange the others wait in"
            self.isolate(
                replica,
                reason,
                late_ranks=self._late_ranks(replica, report) or mine,
                waited_s=report.waited_s,
                limit_s=report.limit_s or 0.0,
                stopped_ranks=mine,
            )
        joined = self.quorum.poll_joins()
        if joined is not None:
            self._emit_membership(joined)
            for replica in joined.joining:
                self._set(replica, self.replicas[replica].with_phase(Phase.RUNNING))
                self._emit(f"replica:{replica}", Phase.RUNNING, joined_epoch=joined.epoch)
        self.quorum.settle_joins()
        self._collect_answers()
        self._check_finished()
        return self._take_events()

    def _store_gone(self, wait_s: float = 1.0) -> bool:
        """Whether the store process has ended (waiting a moment: a connection it dropped
        as it died can be seen before its exit)."""
        return self.store_host is not None and self.store_host.wait_gone(wait_s)

    def _store_lost(self) -> None:
        """The quorum's store process ended: no rank can reach the quorum or its peers, and a
        new coordinator would wait on the dead address for its whole connect timeout. The
        job fails at once with that cause; its ranks are stopped."""
        assert self.store_host is not None
        code = self.store_host.returncode
        for rank in self._ranks.values():
            if not rank.exit_collected:
                rank.expected_stop = True
                self.launcher.signal(rank.spec.rank, signal.SIGKILL)
        self.phase = Phase.FAILED
        reason = f"the quorum's store process exited with {code}: every rank lost its store"
        self._emit("job", Phase.FAILED, reason=reason)

    def _look_at_ranks(self) -> Looks:
        """Each live rank's previous and current look (state, CPU time), by the launcher."""
        looks = {}
        for rank_id, rank in self._ranks.items():
            if rank.exit_collected:
                continue
            now = self.launcher.sample(rank_id)  # a relaunched rank: a new pid, new history
            looks[rank_id] = (self._looks.get(rank.pid), now)
            if now is not None:
                self._looks[rank.pid] = now
        return looks

    def look_now(self) -> bool:
        """Whether a rank the others wait for is stopped now (the quorum's heartbeats as the
        store holds them, the rank's state from the launcher): then the controller polls at
        once instead of at the end of its telemetry wait. Records nothing, and says so once
        per rank and heartbeat (a job suspended as a whole, or a coordinator in its grace
        period, would otherwise have it ask again and again)."""
        if self.phase is not Phase.RUNNING or self.quorum.store is None:
            return False
        try:
            behind = self.quorum.behind()
        except RuntimeError:
            return True  # the store connection failed: the poll's handling is due
        held = set(self.held())
        for rank, step in behind.items():
            found = self._ranks.get(rank)
            if found is None or found.exit_collected or rank in held:
                continue
            if (found.pid, step) in self._woken:
                continue
            if procstat.stopped(self.launcher.sample(rank)):
                self._woken.add((found.pid, step))
                return True
        return False

    def _stopped_ranks(self, report: StallReport, looks: Looks) -> list[int]:
        """The stopped ranks that hold the others up (``_stopped_in``), seen so twice: once
        more ``CONFIRM_S`` later, as a job suspended or resumed rank by rank passes through
        moments in which only some of its ranks are stopped."""
        found = self._stopped_in(report, looks)
        if not found:
            return []
        self.sleep(CONFIRM_S)
        again = {r: (now, self.launcher.sample(r)) for r, (_, now) in looks.items()}
        if self._suspended(again):
            return []
        return sorted(set(found) & set(self._stopped_in(report, again)))

    def _stopped_in(self, report: StallReport, looks: Looks) -> list[int]:
        """Ranks that hold the others up and are stopped (``procstat.stopped``: SIGSTOP),
        found as soon as a member waits for them: the late ones, and once the others have
        waited a whole limit, any member's rank (stopped inside the exchange, after its
        heartbeat). A rank something holds stopped on purpose (``held``: an injected slow
        fault) is slow, not stopped, and goes by the limit like any other."""
        members = self._member_ranks(looks)
        suspects = set(report.late_ranks)
        if report.limit_s is not None and report.waited_s >= report.limit_s:
            suspects |= members
        held = set(self.held())
        return sorted(
            r for r in suspects & members if r not in held and procstat.stopped(looks[r][1])
        )

    def _member_ranks(self, looks: Looks) -> set[int]:
        """The live ranks of the healthy members that were looked at."""
        healthy = set(self.quorum.healthy)
        return {r for r in looks if r in self._ranks and self._replica(r) in healthy}

    def _suspended(self, looks: Looks) -> bool:
        """Whether every live rank of the healthy members is stopped: the job was suspended
        as a whole (a scheduler's SIGSTOP), nobody waits for anybody, and nobody is hung."""
        members = self._member_ranks(looks)
        return bool(members) and all(procstat.stopped(looks[r][1]) for r in members)

    def _replica(self, rank: int) -> int:
        return self.launch.layout.rank(rank).replica

    def _straggling(self, replica: int, report: StallReport, looks: Looks) -> bool:
        """Whether every late rank of ``replica`` is running (runnable, or it got CPU time
        since the last look) and the others have waited less than ``straggler_factor``
        stall limits: such a rank is slow, not hung. A stopped or blocked one is hung."""
        if report.limit_s is None or report.waited_s >= self.straggler_factor * report.limit_s:
            return False
        late = self._late_ranks(replica, report)
        return bool(late) and all(procstat.running(*looks.get(r, (None, None))) for r in late)

    def _exiting(self, replica: int, report: StallReport, looks: Looks) -> bool:
        """Whether a late rank of ``replica`` has ended but its exit is not collected."""
        late = self._late_ranks(replica, report)
        return any(r in looks and procstat.exited(looks[r][1]) for r in late)

    def _late_ranks(self, replica: int, report: StallReport) -> list[int]:
        """The ranks of ``replica`` that the stall report found missing."""
        return [r for r in report.late_ranks if self.launch.layout.rank(r).replica == replica]

    def _on_exit(self, rank: _Rank, code: int, when: float) -> None:
        replica = rank.spec.replica
        if code == 0:
            rank.clean = True
        collateral = code != 0 and self.replicas[replica].dropped_at is not None
        if code != 0 and not collateral:
            self._fail(replica, when, f"rank {rank.spec.rank} exited with {code}")
            rank.culprit = True
        collateral = collateral and not rank.culprit
        self._emit(
            f"rank:{rank.spec.rank}",
            Phase.EXITED,
            time=when,
            exit_code=code,
            collateral=collateral,
            node=rank.spec.node,
            replica=replica,
        )

    def _fail(self, replica: int, when: float, reason: str, **evidence: object) -> None:
        """Takes the replica out of the quorum and stops its other ranks; ``evidence`` (of a
        stall: the late ranks, how long the others waited, the limit) goes with the event."""
        self._set(replica, self.replicas[replica].dropped(when))
        self._lost.add(replica)
        membership = self.quorum.remove(replica, reason)
        if membership is not None:
            self._emit_membership(membership, removed=replica, reason=reason)
        self._emit(f"replica:{replica}", Phase.EXITED, reason=reason, evidence=evidence)
        for rank in self._replica_ranks(replica):  # fencing: a dropped replica must not go on
            self.launcher.signal(rank.spec.rank, signal.SIGKILL)

    def isolate(self, replica: int, reason: str, **evidence: object) -> bool:
        """Drops a live replica (hung, or asked to): its ranks are killed; their exits follow."""
        if self.replicas[replica].dropped_at is not None:
            return False
        if replica not in self.quorum.current.members:
            return False
        for rank in self._replica_ranks(replica):
            rank.culprit = True
        self._fail(replica, self.clock(), reason, **evidence)
        return True

    def _check_finished(self) -> None:
        if self.phase is not Phase.RUNNING:
            return
        # Live until its exit is collected: a process the launcher has reaped but not yet
        # reported would otherwise end the job before its exit code is known.
        live = [r for r in self._ranks.values() if not r.exit_collected]
        healthy_done = [r for r in self.quorum.healthy if self._replica_clean(r)]
        if live and healthy_done and all(r.spec.replica not in self.quorum.healthy for r in live):
            for rank in live:  # joiners the job finished without: nobody left to catch up from
                rank.expected_stop = True
                self.launcher.signal(rank.spec.rank, signal.SIGKILL)
            live = []
        if live:
            return
        if len(healthy_done) >= max(1, self.quorum.min_replicas):
            self.phase = Phase.SUCCEEDED
            self._emit("job", Phase.SUCCEEDED, replicas=healthy_done, lost=sorted(self._lost))
        else:
            self.phase = Phase.FAILED
            self._emit("job", Phase.FAILED, reason="no replica finished training")
        self._collect_answers(final=True)

    def _replica_clean(self, replica: int) -> bool:
        return all(r.clean for r in self._replica_ranks(replica))

    def _replica_ranks(self, replica: int) -> list[_Rank]:
        return [r for r in self._ranks.values() if r.spec.replica == replica]

    def settle(self) -> list[LifecycleEvent]:
        """Replica recovery never fails the job for one replica; ``poll`` decides the end.
        After the tick's actions (replica restarts) ran: too few healthy replicas left
        restart the whole job from its newest checkpoint."""
        if self._wiped_out():
            healthy = list(self.quorum.healthy)
            self.restart_job(
                f"wipe-out: {len(healthy)} healthy replicas {healthy}, "
                f"fewer than the minimum of {max(1, self.quorum.min_replicas)}"
            )
        return self._take_events()

    # ---- recovery ----------------------------------------------------------------------
    def restart_coordinator(self, reason: str, log: MembershipLog | None = None) -> None:
        """Replaces the quorum coordinator by a new one that resumes from ``log`` (by
        default the old one's): its store address, newest epoch and expected joiners.

        The ranks keep their store connection (the store lives in its own process) and
        see the same epoch numbering; only the coordinator's heartbeat history restarts.
        """
        old = self.quorum
        log = log or old.log
        if log is None or log.last() is None:
            raise RuntimeError(
                "the coordinator cannot be restarted: it has no membership log with a record; "
                "give the QuorumService a log (the run store) before start()"
            )
        old.close()
        self.quorum = old.successor(log)
        self.quorum.start()
        self._emit_membership(self.quorum.current, resumed=True, reason=reason)

    def _emit_membership(self, membership: Membership, **detail: object) -> None:
        """Records a membership epoch as a lifecycle event of the quorum."""
        self._emit(
            "quorum",
            Phase.RUNNING,
            None,
            epoch=membership.epoch,
            members=list(membership.members),
            **detail,
        )

    def restart_replica(self, replica: int, reason: str) -> bool:
        """Relaunches one replica to catch up; False once its budget is spent (evicted)."""
        state = self.replicas[replica]
        if state.restarts >= self.max_restarts:
            self._set(replica, state.with_phase(Phase.EVICTED))
            self._emit(
                f"replica:{replica}",
                Phase.EVICTED,
                reason=f"restart budget of {self.max_restarts} spent",
            )
            return False
        if replica in self.quorum.current.members:
            self.isolate(replica, reason)
        ranks = self._replica_ranks(replica)
        for rank in ranks:
            rank.expected_stop = True
        self.launcher.stop([r.spec.rank for r in ranks], 0.0)
        self.restarts += 1
        self._set(replica, self.replicas[replica].relaunched())
        self._emit(f"replica:{replica}", Phase.RECOVERING, reason=reason)
        numbers = [s.rank for s in self.launch.layout.ranks() if s.replica == replica]
        self.quorum.forget_heartbeats(numbers)
        self.quorum.expect(replica, self.replicas[replica].incarnation)
        self._launch_replica(replica)
        return True

    def restart_job(self, reason: str) -> bool:
        """The last resort: every rank stops and the whole job starts again from its newest
        checkpoint (the ranks load it). False once the job's own budget is spent, in which
        case the job has failed."""
        if self.job_restarts >= self.max_job_restarts:
            self.stop_all()
            self.phase = Phase.FAILED
            self._emit(
                "job",
                Phase.FAILED,
                reason=f"{reason}; full-job restart budget of {self.max_job_restarts} spent",
            )
            return False
        self.phase = Phase.RECOVERING
        self._emit("job", Phase.RECOVERING, reason=reason, source="newest checkpoint")
        for rank in self._ranks.values():
            rank.expected_stop = True
        self.launcher.stop(list(self._ranks), 0.0)
        self.job_restarts += 1
        self.restarts += 1
        self.attempt += 1
        membership = self.quorum.restart_all(reason)
        self._emit_membership(membership)
        for replica, state in self.replicas.items():
            self._set(replica, state.relaunched(budgeted=False))
            self._launch_replica(replica)
        self.phase = Phase.RUNNING
        return True

    def _wiped_out(self) -> bool:
        """Fewer healthy replicas than the minimum while the job is not done."""
        if self.phase is not Phase.RUNNING or self.quorum.store is None:
            return False
        return len(self.quorum.healthy) < max(1, self.quorum.min_replicas)

    def evict(self, node: str, reason: str) -> list[int]:
        """Excludes a node from later launches; its replicas restart on spare nodes."""
        self.evicted_nodes.add(node)
        self._emit(f"node:{node}", Phase.EVICTED, reason=reason)
        hit = sorted({r.spec.replica for r in self._ranks.values() if r.spec.node == node})
        return [r for r in hit if self.restart_replica(r, f"node {node} evicted: {reason}")]

    # ---- the control protocol ------------------------------------------------------------
    def execute(self, action: Action) -> Outcome:
        """Runtime protocol: restart(replica|rank|job), isolate(replica), evict(node),
        checkpoint, rollback(step:N|job), skip_batch(job|replica|rank), notify. The
        commands to the ranks (checkpoint, rollback, skip_batch) return a pending outcome;
        their final one comes from ``outcomes()`` after a later ``poll``."""
        if action.key in self._done_keys:
            return self._outcome(action, OutcomeStatus.SKIPPED, "duplicate of an executed action")
        if self.finished:
            return self._outcome(action, OutcomeStatus.SKIPPED, f"job already {self.phase.value}")
        kind, (scope, _, name) = action.kind, action.target.partition(":")
        self._done_keys.add(action.key)
        if kind is ActionKind.NOTIFY:
            log.warning("eagleeye notice: %s", action.reason)
            return self._outcome(action, OutcomeStatus.DONE, "logged")
        if kind is ActionKind.EVICT and scope == "node":
            moved = self.evict(name, action.reason)
            return self._outcome(
                action,
                OutcomeStatus.DONE,
                f"node {name} evicted; moved {moved}",
                node=name,
                moved=moved,
            )
        if kind in (ActionKind.CHECKPOINT, ActionKind.ROLLBACK, ActionKind.SKIP_BATCH):
            return self._command(action, scope, name)
        if kind is ActionKind.RESTART and scope == "job":
            if self.restart_job(action.reason):
                return self._outcome(
                    action,
                    OutcomeStatus.DONE,
                    f"restarted every replica from the newest checkpoint as attempt {self.attempt}",
                    attempt=self.attempt,
                )
            return self._outcome(action, OutcomeStatus.FAILED, "full-job restart budget spent")
        replica = self._replica_of(scope, name)
        if replica is None:
            return self._outcome(
                action,
                OutcomeStatus.SKIPPED,
                f"{kind.value} {action.target} is not supported by replica recovery",
            )
        if kind is ActionKind.ISOLATE:
            done = self.isolate(replica, action.reason)
            status = OutcomeStatus.DONE if done else OutcomeStatus.SKIPPED
            return self._outcome(
                action, status, f"replica {replica} isolated" if done else "", replica=replica
            )
        if kind is ActionKind.RESTART:
            return self._restart(action, replica)
        return self._outcome(action, OutcomeStatus.SKIPPED, f"{kind.value} not supported")

    def _restart(self, action: Action, replica: int) -> Outcome:
        if self.quorum.healthy == (replica,):
            return self._outcome(
                action,
                OutcomeStatus.SKIPPED,
                f"replica {replica} is the only healthy one: nobody to catch up from",
                replica=replica,
            )
        if not self.quorum.healthy:  # e.g. the source died while it served a catch-up
            # a wipe-out seen one death per tick (the other replica is already recovering)
            reason = f"wipe-out: no healthy replica for replica {replica} to catch up from"
            if self.restart_job(f"{reason}: {action.reason}"):
                return self._outcome(
                    action,
                    OutcomeStatus.DONE,
                    f"{reason}; the whole job restarted from its newest checkpoint "
                    f"as attempt {self.attempt}",
                    replica=replica,
                    attempt=self.attempt,
                )
            return self._outcome(action, OutcomeStatus.FAILED, f"{reason}; job budget spent")
        if not self.restart_replica(replica, action.reason):
            spent = f"replica {replica} evicted: budget spent"
            if self.restart_job(f"{spent}: {action.reason}"):
                return self._outcome(
                    action,
                    OutcomeStatus.DONE,
                    f"{spent}; the whole job restarted from its newest checkpoint "
                    f"as attempt {self.attempt}",
                    replica=replica,
                    evicted=True,
                    attempt=self.attempt,
                )
            return self._outcome(
                action, OutcomeStatus.FAILED, f"{spent}; full-job restart budget spent"
            )
        incarnation = self.replicas[replica].incarnation
        source = self.quorum.current.source
        return self._outcome(
            action,
            OutcomeStatus.DONE,
            f"restarted replica {replica} as incarnation {incarnation}; "
            f"it catches up from replica {source}",
            replica=replica,
            incarnation=incarnation,
            source=source,
        )

    # ---- commands to the ranks ------------------------------------------------------------
    def _command(self, action: Action, scope: str, name: str) -> Outcome:
        """checkpoint (target job), rollback (target ``step:N``, or job for the newest
        checkpoint), skip_batch (job: every replica; replica:R or rank:N: that replica)."""
        kind = action.kind
        step, replicas = -1, tuple[int, ...]()
        if kind is ActionKind.ROLLBACK:
            if scope == "step" and name.isdigit():
                step = int(name)
            elif action.target != "job":
                return self._outcome(
                    action,
                    OutcomeStatus.FAILED,
                    f"rollback target {action.target!r} is not step:N or job",
                )
            busy = [r for r, s in self.replicas.items() if s.phase is Phase.RECOVERING]
            if self.quorum.current.joining or busy:
                return self._outcome(
                    action,
                    OutcomeStatus.SKIPPED,
                    "a replica is catching up; roll back once it has rejoined",
                )
            step = step if step >= 0 else 2**62
        elif kind is ActionKind.SKIP_BATCH and action.target != "job":
            replica = self._replica_of(scope, name)
            if replica is None:
                return self._outcome(
                    action,
                    OutcomeStatus.FAILED,
                    f"skip_batch target {action.target!r} is not job, replica:R or rank:N",
                )
            replicas = (replica,)
        members = self.quorum.healthy
        store = self.quorum.store
        if not members or store is None:
            return self._outcome(action, OutcomeStatus.FAILED, "no healthy replica to run it")
        lr_factor = action.param("lr_factor", 1.0)
        command = self._inflight.send(store, action, kind.value, members, step, replicas, lr_factor)
        return self._outcome(
            action,
            OutcomeStatus.PENDING,
            f"{command.kind} #{command.number} sent to replicas {list(members)}",
            command=command.number,
            replicas=list(members),
        )

    def outcomes(self) -> list[Outcome]:
        """Final outcomes of the commands that ended since the last call (``poll`` collects
        their answers)."""
        found, self._finished = self._finished, []
        return found

    def pending(self) -> int:
        """How many commands are in flight."""
        return len(self._inflight)

    def _collect_answers(self, final: bool = False) -> None:
        """The commands whose answers are all in, or whose deadline passed, end; at the
        job's end every command still in flight ends with the answers it has."""
        members = () if final else self.quorum.current.members
        for over in self._inflight.poll(self.quorum.store, members):
            outcome = self._command_outcome(over)
            self._finished.append(outcome)
            # The answers, kept with the run's lifecycle (the store's record of them).
            done = outcome.status is OutcomeStatus.DONE
            self._emit(
                f"command:{over.command.number}",
                Phase.SUCCEEDED if done else Phase.FAILED,
                key=over.action.key,
                outcome=outcome.detail,
                **outcome.data,
            )

    def _command_outcome(self, over: Finished) -> Outcome:
        command, action = over.command, over.action
        data: dict[str, object] = {
            "command": command.number,
            "kind": command.kind,
            "answers": {str(r): answer_json(a) for r, a in sorted(over.answers.items())},
            "missing": list(over.missing),
            "left": list(over.left),
            "waited_s": round(over.waited_s, 3),
        }
        name = f"{command.kind} #{command.number}"
        if over.missing:
            return self._outcome(
                action,
                OutcomeStatus.FAILED,
                f"{name}: no answer from replicas {list(over.missing)} "
                f"within {self.command_timeout_s:.0f} s",
                **data,
            )
        errors = {r: a.error for r, a in over.answers.items() if isinstance(a, Failed)}
        if errors:
            return self._outcome(action, OutcomeStatus.FAILED, f"{command.kind}: {errors}", **data)
        if not over.answers:
            left = list(over.left)
            return self._outcome(
                action,
                OutcomeStatus.FAILED,
                f"{name}: replicas {left} left the quorum or ended before answering",
                **data,
            )
        if command.kind == CHECKPOINT:
            saved = [(r, a) for r, a in sorted(over.answers.items()) if isinstance(a, Saved)]
            if not saved:
                return self._outcome(action, OutcomeStatus.FAILED, "no replica saved", **data)
            replica, first = saved[0]
            return self._outcome(
                action,
                OutcomeStatus.DONE,
                f"replica {replica} saved step {first.step} to {first.path}",
                step=first.step,
                path=first.path,
                **data,
            )
        if command.kind == ROLLBACK:
            restored = sorted({a.step for a in over.answers.values() if isinstance(a, Restored)})
            lowered = f", learning rate x{command.lr_factor:g}" if command.lr_factor != 1 else ""
            return self._outcome(
                action,
                OutcomeStatus.DONE,
                f"replicas {sorted(over.answers)} rolled back to the checkpoint of step {restored}"
                + lowered,
                restored=restored,
                **data,
            )
        skipped = {r: a.batch for r, a in sorted(over.answers.items()) if isinstance(a, Skipped)}
        return self._outcome(action, OutcomeStatus.DONE, f"skipped batches {skipped}", **data)

    def _replica_of(self, scope: str, name: str) -> int | None:
        try:
            index = int(name)
        except ValueError:
            return None
        if scope == "replica" and index in self.replicas:
            return index
        if scope == "rank" and 0 <= index < self.launch.layout.world_size:
            return self.launch.layout.rank(index).replica
        return None

    # ---- stopping ----------------------------------------------------------------------------
    def stop_all(self, grace_s: float | None = None) -> None:
        """Stops every rank (SIGCONT and SIGTERM, SIGKILL after ``grace_s``; default: the
        launch's), then the quorum and the store's own process."""
        for rank in self._ranks.values():
            rank.expected_stop = True
        grace = self.launch.stop_grace_s if grace_s is None else grace_s
        self.launcher.stop(list(self._ranks), grace)
        self.quorum.close()
        if self.store_host is not None:
            self.store_host.close()

    def stop_restarting(self, reason: str) -> None:
        """Replica restarts are budgeted per replica; a crash loop's reason is kept."""
        self.no_restart = reason

    # ---- state -----------------------------------------------------------------------------
    def log_path(self, rank: int) -> Path | None:
        """The log file of the rank's current process."""
        found = self._ranks.get(rank)
        return None if found is None else found.log_path

    def alive(self) -> int:
        return sum(1 for rank in self._ranks if self.launcher.running(rank))

    def pids(self) -> dict[int, int]:
        return {rank: r.pid for rank, r in self._ranks.items()}

    def _emit(
        self, subject: str, phase: Phase, time: float | None = None, **detail: object
    ) -> None:
        when = self.clock() if time is None else time
        self._events.append(LifecycleEvent(subject, phase, when, self.attempt, detail))

    def _take_events(self) -> list[LifecycleEvent]:
        events, self._events = self._events, []
        return events

    def _outcome(
        self, action: Action, status: OutcomeStatus, detail: str, **data: object
    ) -> Outcome:
        return Outcome(action, status, detail, self.clock(), data)


def _nodes(specs: list[RankSpec]) -> list[str]:
    return sorted({s.node for s in specs})


def _python() -> str:
    import sys

    return sys.executable
