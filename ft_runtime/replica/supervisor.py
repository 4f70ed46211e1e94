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
the quorum's store (``ft_runtime.commands``), and the quorum's coordinator can be replaced
by one that resumes from its membership log (``restart_coordinator``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import signal
import time
from collections.abc import Callable
from pathlib import Path

from ft_runtime import procstat
from ft_runtime.layout import RankSpec
from ft_runtime.membership import Membership
from ft_runtime.priority import process_thread_ids
from ft_runtime.procstat import ProcSample
from ft_runtime.quorum import ENV_QUORUM, MembershipLog, QuorumService
from ft_runtime.replica.auth import ENV_REPLICA_SECRET
from ft_runtime.replica.protocol import (
    KEY_COMMANDS,
    Answer,
    Command,
    Failed,
    ProtocolError,
    Restored,
    Saved,
    Skipped,
    decode_answer,
    decode_counter,
    encode,
    key_answer,
    key_command,
)
from ft_runtime.storehost import StoreHost
from ft_runtime.supervisor import JobSupervisor, LaunchSpec, _Rank, _signal
from ft_runtime.types import Action, ActionKind, LifecycleEvent, Outcome, OutcomeStatus, Phase

log = logging.getLogger(__name__)
ENV_BASE_NICE = "EAGLEEYE_BASE_NICE"
"""Niceness a joining rank returns to once caught up (set when it starts lowered)."""
Looks = dict[int, tuple[ProcSample | None, ProcSample | None]]
"""Per live rank: its previous and its current look in /proc."""


class ReplicaSupervisor(JobSupervisor):
    """Owns the ranks of a job whose replicas fail, restart and rejoin independently.

    Args:
        launch: what to start.
        quorum: the membership service (started here).
        max_restarts: restart budget of each replica.
        clock: wall-clock time, seconds.
        max_job_restarts: budget of full-job restarts from the newest checkpoint, the last
            resort when a replica's budget is spent or too few replicas are left.
        command_timeout_s: how long a control command (checkpoint, rollback, skip_batch)
            waits for the replicas' answers.
        joiner_nice: how much lower a relaunched replica's ranks run until they caught up
            (0: not at all), so their start-up does not slow the replicas that train.
        straggler_factor: a replica the quorum finds stalled whose late ranks are all
            running (``ft_runtime.procstat``) is given up to this many stall limits before
            it counts as hung; a stopped or blocked rank counts at once.
    """

    def __init__(
        self,
        launch: LaunchSpec,
        quorum: QuorumService,
        max_restarts: int = 3,
        clock: Callable[[], float] = time.time,
        max_job_restarts: int = 1,
        command_timeout_s: float = 30.0,
        joiner_nice: int = 10,
        straggler_factor: float = 5.0,
    ) -> None:
        super().__init__(launch, max_restarts, clock)
        self.quorum = quorum
        self.max_job_restarts = max_job_restarts
        self.job_restarts = 0
        self.command_timeout_s = command_timeout_s
        self.joiner_nice = joiner_nice
        self.straggler_factor = straggler_factor
        self._looks: dict[int, ProcSample] = {}  # by pid: the last look at each rank
        replicas = launch.layout.replicas
        self.incarnation = dict.fromkeys(range(replicas), 0)
        self.replica_restarts = dict.fromkeys(range(replicas), 0)
        self.replica_phase = dict.fromkeys(range(replicas), Phase.LAUNCH)
        self.evicted_nodes: set[str] = set()
        self._spares = 0
        self._failed_at: dict[int, float] = {}
        self._culprits: set[int] = set()
        self._clean: set[int] = set()
        self._lost: set[int] = set()
        self.store_host: StoreHost | None = None

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
        for replica in range(self.launch.layout.replicas):
            self._launch_replica(replica)
        self.phase = Phase.RUNNING

    def _launch_replica(self, replica: int) -> None:
        incarnation = self.incarnation[replica]
        log_dir = Path(self.launch.log_dir) / f"replica-{replica}-{incarnation}"
        log_dir.mkdir(parents=True, exist_ok=True)
        specs = [self._placed(s) for s in self.launch.layout.ranks() if s.replica == replica]
        joiner = incarnation > 0 and replica not in self.quorum.healthy
        self._emit(f"replica:{replica}", Phase.LAUNCH, incarnation=incarnation)
        self.replica_phase[replica] = Phase.PRE_CHECK
        for spec in specs:
            env = {
                **os.environ,
                **self.launch.env,
                **self.launch.layout.environment(
                    spec, self.launch.master_addr, 0, incarnation, self.launch.run_id
                ),
                "EAGLEEYE_NODE": spec.node,
                ENV_QUORUM: self.quorum.address,
                ENV_REPLICA_SECRET: self.quorum.secret,
            }
            if joiner and self.joiner_nice:
                env[ENV_BASE_NICE] = str(os.getpriority(os.PRIO_PROCESS, 0))
            rank = self._spawn(spec, env, log_dir / f"rank-{spec.rank}.log")
            if joiner and self.joiner_nice:
                _lower_priority(rank.process.pid, self.joiner_nice)
            rank.attempt = incarnation
            self._ranks[spec.rank] = rank
            self._clean.discard(spec.rank)
            self._emit(
                f"rank:{spec.rank}",
                Phase.LAUNCH,
                node=spec.node,
                replica=replica,
                pid=rank.process.pid,
                attempt=incarnation,  # the rank's own attempt: its samples carry it
            )
        # Pre-check: the processes started on nodes that are not evicted.
        alive = all(self._ranks[s.rank].process.poll() is None for s in specs)
        self._emit(f"replica:{replica}", Phase.PRE_CHECK, passed=alive, nodes=_nodes(specs))
        # A relaunched replica runs once the quorum admits it; after a job restart every
        # replica is a member at once.
        if incarnation == 0 or replica in self.quorum.healthy:
            self.replica_phase[replica] = Phase.RUNNING
            self._emit(f"replica:{replica}", Phase.RUNNING, incarnation=incarnation)

    def _placed(self, spec: RankSpec) -> RankSpec:
        if spec.node not in self.evicted_nodes:
            return spec
        return dataclasses.replace(spec, node=f"spare{spec.node_rank}")

    # ---- watching ----------------------------------------------------------------------
    def poll(self) -> list[LifecycleEvent]:
        """Collects exits, drops dead and hung replicas from the quorum, admits joiners."""
        while True:
            try:
                rank_id, attempt, code, when = self._exits.get_nowait()
            except queue.Empty:
                break
            rank = self._ranks.get(rank_id)
            if rank is None or attempt != rank.attempt:
                continue
            rank.exit_collected = True
            if not rank.expected_stop:
                self._on_exit(rank, code, when)
        try:
            stalled = self.quorum.stalled()
        except RuntimeError as exc:  # the coordinator lost its store connection
            self.restart_coordinator(f"coordinator failed: {exc}")
            stalled = []
        looks = self._look_at_ranks()
        for replica in stalled:
            if self._straggling(replica, looks):
                continue  # running, only slow: a busy machine, not a hang (yet)
            if self._exiting(replica, looks):
                continue  # dead, its exit not collected yet: the next poll names the cause
            self.isolate(
                replica,
                "hung: never entered the exchange the others wait in",
                late_ranks=self._late_ranks(replica),
                waited_s=self.quorum.waited_s,
                limit_s=self.quorum.stall_limit() or 0.0,
            )
        joined = self.quorum.poll_joins()
        if joined is not None:
            self._emit_membership(joined)
            for replica in joined.joining:
                self.replica_phase[replica] = Phase.RUNNING
                self._emit(f"replica:{replica}", Phase.RUNNING, joined_epoch=joined.epoch)
        self.quorum.settle_joins()
        self._check_finished()
        return self._take_events()

    def _look_at_ranks(self) -> Looks:
        """Each live rank's previous and current look (state, CPU time) from /proc."""
        looks = {}
        for rank_id, rank in self._ranks.items():
            if rank.exit_collected:
                continue
            pid = rank.process.pid  # a relaunched rank is a new process: a fresh history
            now = procstat.sample(pid)
            looks[rank_id] = (self._looks.get(pid), now)
            if now is not None:
                self._looks[pid] = now
        return looks

    def _straggling(self, replica: int, looks: Looks) -> bool:
        """Whether every late rank of ``replica`` is running (runnable, or it got CPU time
        since the last look) and the others have waited less than ``straggler_factor``
        stall limits: such a rank is slow, not hung. A stopped or blocked one is hung."""
        limit = self.quorum.stall_limit()
        if limit is None or self.quorum.waited_s >= self.straggler_factor * limit:
            return False
        late = self._late_ranks(replica)
        return bool(late) and all(procstat.running(*looks.get(r, (None, None))) for r in late)

    def _exiting(self, replica: int, looks: Looks) -> bool:
        """Whether a late rank of ``replica`` has ended but its exit is not collected."""
        return any(r in looks and procstat.exited(looks[r][1]) for r in self._late_ranks(replica))

    def _late_ranks(self, replica: int) -> list[int]:
        """The ranks of ``replica`` that the quorum's last stall found missing."""
        return [r for r in self.quorum.late_ranks if self.launch.layout.rank(r).replica == replica]

    def _on_exit(self, rank: _Rank, code: int, when: float) -> None:
        replica = rank.spec.replica
        if code == 0:
            self._clean.add(rank.spec.rank)
        collateral = code != 0 and replica in self._failed_at
        if code != 0 and not collateral:
            self._fail(replica, when, f"rank {rank.spec.rank} exited with {code}")
            self._culprits.add(rank.spec.rank)
        collateral = collateral and rank.spec.rank not in self._culprits
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
        self._failed_at[replica] = when
        self._lost.add(replica)
        membership = self.quorum.remove(replica, reason)
        if membership is not None:
            self._emit_membership(membership, removed=replica, reason=reason)
        self._emit(f"replica:{replica}", Phase.EXITED, reason=reason, evidence=evidence)
        for rank in self._replica_ranks(replica):
            _signal(rank.process, signal.SIGKILL)  # fencing: a dropped replica must not go on

    def isolate(self, replica: int, reason: str, **evidence: object) -> bool:
        """Drops a live replica (hung, or asked to): its ranks are killed; their exits follow."""
        if replica in self._failed_at or replica not in self.quorum.current.members:
            return False
        late = [r.spec.rank for r in self._replica_ranks(replica)]
        self._culprits.update(late)
        self._fail(replica, self.clock(), reason, **evidence)
        return True

    def _check_finished(self) -> None:
        if self.phase is not Phase.RUNNING:
            return
        # Live until its exit is collected: a process the waiter thread has reaped but not
        # yet queued would otherwise end the job before its exit code is known.
        live = [r for r in self._ranks.values() if not r.exit_collected]
        healthy_done = [r for r in self.quorum.healthy if self._replica_clean(r)]
        if live and healthy_done and all(r.spec.replica not in self.quorum.healthy for r in live):
            for rank in live:  # joiners the job finished without: nobody left to catch up from
                rank.expected_stop = True
                _signal(rank.process, signal.SIGKILL)
            live = []
        if live:
            return
        if len(healthy_done) >= max(1, self.quorum.min_replicas):
            self.phase = Phase.SUCCEEDED
            self._emit("job", Phase.SUCCEEDED, replicas=healthy_done, lost=sorted(self._lost))
        else:
            self.phase = Phase.FAILED
            self._emit("job", Phase.FAILED, reason="no replica finished training")

    def _replica_clean(self, replica: int) -> bool:
        return all(r.spec.rank in self._clean for r in self._replica_ranks(replica))

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
        self.quorum = QuorumService(
            old.replicas,
            old.replica_size,
            host=old.host,
            min_replicas=old.min_replicas,
            stall_factor=old.stall_factor,
            stall_floor_s=old.stall_floor_s,
            lateness_factor=old.lateness_factor,
            clock=old.clock,
            log=log,
            secret=old.secret,
        )
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
        if self.replica_restarts[replica] >= self.max_restarts:
            self.replica_phase[replica] = Phase.EVICTED
            self._emit(
                f"replica:{replica}",
                Phase.EVICTED,
                reason=f"restart budget of {self.max_restarts} spent",
            )
            return False
        if replica in self.quorum.current.members:
            self.isolate(replica, reason)
        for rank in self._replica_ranks(replica):
            rank.expected_stop = True
            _signal(rank.process, signal.SIGKILL)
            rank.process.wait()
        self.replica_restarts[replica] += 1
        self.restarts += 1
        self.incarnation[replica] += 1
        self.replica_phase[replica] = Phase.RECOVERING
        self._emit(f"replica:{replica}", Phase.RECOVERING, reason=reason)
        self._failed_at.pop(replica, None)
        ranks = [s.rank for s in self.launch.layout.ranks() if s.replica == replica]
        self._culprits.difference_update(ranks)
        self.quorum.forget_heartbeats(ranks)
        self.quorum.expect(replica, self.incarnation[replica])
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
            _signal(rank.process, signal.SIGCONT)
            _signal(rank.process, signal.SIGKILL)
        for rank in self._ranks.values():
            rank.process.wait()
        self.job_restarts += 1
        self.restarts += 1
        self.attempt += 1
        membership = self.quorum.restart_all(reason)
        self._emit_membership(membership)
        self._failed_at.clear()
        self._culprits.clear()
        self._clean.clear()
        for replica in range(self.launch.layout.replicas):
            self.replica_restarts[replica] = 0
            self.incarnation[replica] += 1
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
        checkpoint, rollback(step:N|job), skip_batch(job|replica|rank), notify."""
        if action.key in self._done_keys:
            return self._outcome(action, OutcomeStatus.SKIPPED, "duplicate of an executed action")
        if self.phase in (Phase.SUCCEEDED, Phase.FAILED):
            return self._outcome(action, OutcomeStatus.SKIPPED, f"job already {self.phase.value}")
        kind, (scope, _, name) = action.kind, action.target.partition(":")
        self._done_keys.add(action.key)
        if kind is ActionKind.NOTIFY:
            log.warning("eagleeye notice: %s", action.reason)
            return self._outcome(action, OutcomeStatus.DONE, "logged")
        if kind is ActionKind.EVICT and scope == "node":
            moved = self.evict(name, action.reason)
            return self._outcome(action, OutcomeStatus.DONE, f"node {name} evicted; moved {moved}")
        if kind in (ActionKind.CHECKPOINT, ActionKind.ROLLBACK, ActionKind.SKIP_BATCH):
            return self._command(action, scope, name)
        if kind is ActionKind.RESTART and scope == "job":
            if self.restart_job(action.reason):
                return self._outcome(
                    action,
                    OutcomeStatus.DONE,
                    f"restarted every replica from the newest checkpoint as attempt {self.attempt}",
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
            return self._outcome(action, status, f"replica {replica} isolated" if done else "")
        if kind is ActionKind.RESTART:
            if self.quorum.healthy == (replica,):
                return self._outcome(
                    action,
                    OutcomeStatus.SKIPPED,
                    f"replica {replica} is the only healthy one: nobody to catch up from",
                )
            if not self.restart_replica(replica, action.reason):
                spent = f"replica {replica} evicted: budget spent"
                if self.restart_job(f"{spent}: {action.reason}"):
                    return self._outcome(
                        action,
                        OutcomeStatus.DONE,
                        f"{spent}; the whole job restarted from its newest checkpoint "
                        f"as attempt {self.attempt}",
                    )
                return self._outcome(
                    action, OutcomeStatus.FAILED, f"{spent}; full-job restart budget spent"
                )
            return self._outcome(
                action,
                OutcomeStatus.DONE,
                f"restarted replica {replica} as incarnation {self.incarnation[replica]}; "
                f"it catches up from replica {self.quorum.current.source}",
            )
        return self._outcome(action, OutcomeStatus.SKIPPED, f"{kind.value} not supported")

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
            busy = [r for r, p in self.replica_phase.items() if p is Phase.RECOVERING]
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
        if not members:
            return self._outcome(action, OutcomeStatus.FAILED, "no healthy replica to run it")
        command = self.send_command(kind.value, step, replicas, action.param("lr_factor", 1.0))
        answers = self.await_answers(command, members)
        return self._command_outcome(action, command, members, answers)

    def send_command(
        self, kind: str, step: int = -1, replicas: tuple[int, ...] = (), lr_factor: float = 1.0
    ) -> Command:
        """Writes the next command; every member runs it after the step whose exchange
        first carries it."""
        store = self.quorum.store
        assert store is not None, "start() the supervisor first"
        number = decode_counter(str(store.add(KEY_COMMANDS, 0))) + 1
        command = Command(number, kind, step, replicas, lr_factor)
        store.set(key_command(command.number), encode(command))
        store.add(KEY_COMMANDS, 1)
        return command

    def await_answers(self, command: Command, members: tuple[int, ...]) -> dict[int, Answer]:
        """The members' answers to ``command``, as many as came within the timeout (a value
        that is no valid answer counts as a failure of that replica)."""
        store = self.quorum.store
        assert store is not None
        answers: dict[int, Answer] = {}
        deadline = time.monotonic() + self.command_timeout_s
        while len(answers) < len(members) and time.monotonic() < deadline:
            for replica in members:
                key = key_answer(command.number, replica)
                if replica not in answers and store.check([key]):
                    try:
                        answers[replica] = decode_answer(store.get(key))
                    except ProtocolError as exc:
                        answers[replica] = Failed(f"unreadable answer: {exc}")
            time.sleep(0.01)
        return answers

    def _command_outcome(
        self,
        action: Action,
        command: Command,
        members: tuple[int, ...],
        answers: dict[int, Answer],
    ) -> Outcome:
        missing = sorted(set(members) - set(answers))
        if missing:
            return self._outcome(
                action,
                OutcomeStatus.FAILED,
                f"{command.kind} #{command.number}: no answer from replicas {missing} "
                f"within {self.command_timeout_s:.0f} s",
            )
        errors = {r: a.error for r, a in answers.items() if isinstance(a, Failed)}
        if errors:
            return self._outcome(action, OutcomeStatus.FAILED, f"{command.kind}: {errors}")
        if command.kind == "checkpoint":
            saved = [(r, a) for r, a in answers.items() if isinstance(a, Saved)]
            if not saved:
                return self._outcome(action, OutcomeStatus.FAILED, "no replica saved")
            replica, answer = saved[0]
            return self._outcome(
                action,
                OutcomeStatus.DONE,
                f"replica {replica} saved step {answer.step} to {answer.path}",
            )
        if command.kind == "rollback":
            restored = sorted({a.step for a in answers.values() if isinstance(a, Restored)})
            lowered = f", learning rate x{command.lr_factor:g}" if command.lr_factor != 1 else ""
            return self._outcome(
                action,
                OutcomeStatus.DONE,
                f"replicas {sorted(answers)} rolled back to the checkpoint of step {restored}"
                + lowered,
            )
        skipped = {r: a.batch for r, a in answers.items() if isinstance(a, Skipped)}
        return self._outcome(action, OutcomeStatus.DONE, f"skipped batches {skipped}")

    def _replica_of(self, scope: str, name: str) -> int | None:
        try:
            index = int(name)
        except ValueError:
            return None
        if scope == "replica" and index in self.incarnation:
            return index
        if scope == "rank" and 0 <= index < self.launch.layout.world_size:
            return self.launch.layout.rank(index).replica
        return None

    def stop_all(self, grace_s: float | None = None) -> None:
        super().stop_all(grace_s)
        self.quorum.close()
        if self.store_host is not None:
            self.store_host.close()


def _lower_priority(pid: int, nice: int) -> None:
    """A joiner's start-up (imports) and catch-up must not take CPU from the survivors."""
    try:
        os.setpriority(os.PRIO_PROCESS, pid, os.getpriority(os.PRIO_PROCESS, 0) + nice)
    except OSError as exc:  # it exited already, or the system refuses
        log.warning("could not lower the priority of joining rank pid %d: %s", pid, exc)


def restore_priority() -> None:
    """Called by a joining rank once caught up: every thread of the process goes back to
    the priority the rank was launched with (``ENV_BASE_NICE``). A nice value belongs to
    a thread, and threads started while the rank ran lowered (torch's, the hook's) inherit
    the lowered value, so each is restored, not only the caller. Raising a priority may
    need privileges; without them the rank stays lower and says so."""
    base = os.environ.get(ENV_BASE_NICE)
    if base is None:
        return
    for tid in process_thread_ids():
        try:
            os.setpriority(os.PRIO_PROCESS, tid, int(base))
        except ProcessLookupError:
            continue  # the thread ended meanwhile
        except OSError as exc:
            log.warning("joined at a lowered priority; could not restore it: %s", exc)
            return


def _nodes(specs: list[RankSpec]) -> list[str]:
    return sorted({s.node for s in specs})
