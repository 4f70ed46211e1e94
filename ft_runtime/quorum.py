"""The quorum service: who takes part in the cross-replica all-reduce, epoch by epoch.

It runs in the controller and keeps its state in a ``TCPStore`` that the controller hosts,
so the store outlives any rank. Ranks read it (``ft_runtime.ftar``); only the service
writes the membership. The keys and their messages are ``ft_runtime.replica.protocol``'s
(docs/protocol.md lists them); every value read is decoded there before it is used.

Membership changes at step boundaries: a failure breaks the current epoch (survivors abort
and retry in the next one); a join is proposed in a new epoch that the members adopt at
the next step boundary they agree on. A hung member is found from the heartbeats: the
others have waited in the exchange for longer than the stall limit while it never entered.
A heartbeat carries no time: the service notes when it first saw each one on its own clock,
so a rank whose host clock is off is judged right.
The limit follows the job's own pace and noise: ``stall_factor`` median step times, but
never less than ``lateness_factor`` times the worst lateness seen among healthy members
lately (how long the first rank to enter an exchange waited for the last one, measured
from the same heartbeats), nor less than ``stall_floor_s``. A steady job is found hung in
about two step times; a job whose ranks arrive unevenly on a busy machine gets a limit
wide enough that its ordinary stragglers are not taken for hangs.

Nothing in the store is trusted or readable without the job's secret: the service and
every rank reach it through ``ft_runtime.replica.store.SealedStore`` (opaque key names,
sealed values). torch's ``TCPStore`` server listens on every interface whatever ``host``
says; the secret, not the binding, keeps other clients out (docs/protocol.md).

The coordinator is restartable. Every membership it decides is first recorded through a
``MembershipLog`` (the run store, in Eagle Eye) and only then published; the store itself
can live in a process of its own (``ft_runtime.storehost``). A coordinator started on the
same log resumes at the newest recorded epoch, with the incarnations it was expecting, and
numbers the next epoch from there, so ranks see one epoch sequence across the restart.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta

from ft_runtime import _dist as dist
from ft_runtime.membership import Membership, MembershipLog, QuorumRecord
from ft_runtime.replica import config
from ft_runtime.replica.auth import JobSecret, new_secret
from ft_runtime.replica.protocol import (
    KEY_EPOCH,
    EpochBroken,
    EpochPointer,
    EpochStart,
    Heartbeat,
    JoinRequest,
    ProtocolError,
    decode,
    encode,
    encode_membership,
    key_broken,
    key_heartbeat,
    key_join,
    key_members,
    key_start,
)
from ft_runtime.replica.store import SealedStore

__all__ = [
    "ENV_QUORUM",
    "Membership",
    "MembershipLog",
    "QuorumRecord",
    "QuorumService",
    "StallReport",
    "key_broken",
    "key_members",
    "key_start",
]

STALL_FACTOR, STALL_FLOOR_S, LATENESS_FACTOR = (
    config.STALL_FACTOR,
    config.STALL_FLOOR_S,
    config.LATENESS_FACTOR,
)
LATENESS_WINDOW = 64
"""Steps whose lateness the noise guard remembers."""
FIRST_TIMED_STEP = 2
"""Steps before this one (start-up: imports, first allocations) are no sample of noise."""

ENV_QUORUM = "EAGLEEYE_QUORUM"
"""``host:port`` of the quorum's TCPStore; set for ranks of a replica-recovery job."""


MAX_STEPS_BETWEEN_LOOKS = 8
"""A rank seen this many steps further on since the last look still gives a step time."""


@dataclass(frozen=True, slots=True)
class StallReport:
    """One look at the heartbeats: the members found hung by the limit (none: no stall),
    the ranks that have not entered the exchange the others wait in (named as soon as one
    waits, limit or not: a caller with evidence of its own, a stopped process, may act on
    them before the limit), how long the first of those waited (the coordinator's clock)
    and the limit it was judged by (None: no pace known yet)."""

    replicas: tuple[int, ...] = ()
    late_ranks: tuple[int, ...] = ()
    waited_s: float = 0.0
    limit_s: float | None = None


LOOK_GAP_S = 1.0
"""Looks at the heartbeats this far apart mean the coordinator stood still (it looks at
every tick of the controller, 0.05 s)."""


class QuorumService:
    """Membership epochs for ``replicas`` replicas of ``replica_size`` ranks.

    Args:
        replicas: replica count; replica r holds ranks ``r*size .. r*size+size-1``.
        replica_size: ranks per replica.
        host: the address ranks reach the store at. torch's ``TCPStore`` server listens on
            every interface whatever this says: the job's secret protects the store.
        min_replicas: fewer healthy members than this and ``degraded_below_min`` is True.
        stall_factor: a member that has not entered the exchange while the others waited
            this many median step times is hung (unless the noise guard says otherwise).
        stall_floor_s: least waiting time that counts as a stall, whatever the pace.
        lateness_factor: the noise guard: the limit is at least this many times the
            largest lateness of the recent steps in which every member entered.
        clock: wall-clock time, seconds.
        log: where each membership is recorded before it is published; a service whose
            log holds a record resumes from it instead of starting at epoch 0.
        store_address: ``host:port`` of a store hosted elsewhere (``storehost``); without
            it the service hosts the store itself.
        secret: the job's secret (a new one by default); the ranks must get the same one
            (``ENV_REPLICA_SECRET``), and so must a coordinator that resumes this one.
    """

    def __init__(
        self,
        replicas: int,
        replica_size: int,
        host: str = "127.0.0.1",
        min_replicas: int = 1,
        stall_factor: float = STALL_FACTOR,
        stall_floor_s: float = STALL_FLOOR_S,
        lateness_factor: float = LATENESS_FACTOR,
        clock: Callable[[], float] = time.time,
        log: MembershipLog | None = None,
        store_address: str | None = None,
        secret: str | None = None,
    ) -> None:
        self.replicas = replicas
        self.replica_size = replica_size
        self.host = host
        self.min_replicas = min_replicas
        self.stall_factor = stall_factor
        self.stall_floor_s = stall_floor_s
        self.lateness_factor = lateness_factor
        self.clock = clock
        self.secret = secret or new_secret()
        self._job_secret = JobSecret(self.secret)
        self.store: SealedStore | None = None
        self._port = 0
        self.current = Membership(0, tuple(range(replicas)))
        self.history: list[Membership] = []
        self._step_times: deque[float] = deque(maxlen=64)
        self._last_hb: dict[int, tuple[int, float]] = {}  # rank -> (step, when it entered)
        self._seen_hb: dict[int, tuple[int, int, float]] = {}  # rank -> (seq, step, seen at)
        self._arrivals: dict[int, dict[int, float]] = {}  # step -> rank -> when it entered
        self._lateness: deque[float] = deque(maxlen=LATENESS_WINDOW)
        self._looked_at = 0.0  # the coordinator's last look at the heartbeats
        self._grace_until = 0.0  # no stall is judged before (after a gap in its looks)
        self._incarnation: dict[int, int] = {}
        self.log = log
        self.store_address = store_address
        self.resumed = False

    # ---- set-up ------------------------------------------------------------------------
    def start(self) -> str:
        """Connects to (or hosts) the store and publishes the current membership: epoch 0
        with every replica, or the newest one the log holds. Returns ``host:port``."""
        record = self.log.last() if self.log is not None else None
        address = record.store_address if record is not None else self.store_address
        if address is None:
            raw = dist.TCPStore(
                self.host, 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30)
            )
        else:
            host, _, port = address.rpartition(":")
            self.host = host
            raw = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=30))
        self._port = raw.port
        self.store = SealedStore(raw, self._job_secret)
        if record is None:
            self._publish(self.current)
        else:
            self.resumed = True
            self._incarnation = dict(record.expected)
            self.current = record.membership
            self.history.append(record.membership)
            self._announce(record.membership)
        return self.address

    @property
    def address(self) -> str:
        assert self.store is not None, "start() the quorum service first"
        return f"{self.host}:{self._port}"

    def _publish(self, membership: Membership) -> None:
        assert self.store is not None
        if self.log is not None:  # recorded first: a restart never forgets a published epoch
            self.log.record(
                QuorumRecord(membership, self.address, dict(self._incarnation)), self.clock()
            )
        self._announce(membership)
        self.current = membership
        self.history.append(membership)

    def _announce(self, membership: Membership) -> None:
        assert self.store is not None
        self.store.set(key_members(membership.epoch), encode_membership(membership))
        self.store.set(KEY_EPOCH, encode(EpochPointer(membership.epoch)))

    # ---- membership changes ------------------------------------------------------------------
    def remove(self, replica: int, reason: str) -> Membership | None:
        """Takes a replica out: breaks the current epoch and publishes the next one.

        Returns the new membership, or None when the replica was not a member.
        """
        if replica not in self.current.members or self.store is None:
            return None
        self.store.set(key_broken(self.current.epoch), encode(EpochBroken(reason[:200])))
        # A dropped replica is admitted again only as the incarnation restarted after this.
        self._incarnation.pop(replica, None)
        self.store.delete_key(key_join(replica))
        members = tuple(r for r in self.current.members if r != replica)
        joining = tuple(r for r in self.current.joining if r != replica)
        self._publish(Membership(self.current.epoch + 1, members, joining))
        return self.current

    def restart_all(self, reason: str) -> Membership:
        """A full-job restart: the current epoch breaks and the next one holds every replica
        again, none joining (they all restore the same checkpoint)."""
        assert self.store is not None, "start() the quorum service first"
        self.store.set(key_broken(self.current.epoch), encode(EpochBroken(reason[:200])))
        self._incarnation.clear()
        for replica in range(self.replicas):
            self.store.delete_key(key_join(replica))
        self._step_times.clear()
        self._lateness.clear()
        self._arrivals.clear()
        self.forget_heartbeats(range(self.replicas * self.replica_size))
        self._publish(Membership(self.current.epoch + 1, tuple(range(self.replicas))))
        return self.current

    def expect(self, replica: int, incarnation: int) -> None:
        """A relaunched replica will ask to join as this incarnation."""
        self._incarnation[replica] = incarnation
        if self.log is not None and self.store is not None:
            self.log.record(
                QuorumRecord(self.current, self.address, dict(self._incarnation)), self.clock()
            )

    def poll_joins(self) -> Membership | None:
        """Admits replicas whose ranks said they are ready; returns the new epoch, if any."""
        if self.store is None:
            return None
        ready = []
        for replica, incarnation in self._incarnation.items():
            if replica in self.current.members:
                continue
            key = key_join(replica)
            if self.store.check([key]) and _join(self.store.get(key)) == (replica, incarnation):
                ready.append(replica)
        if not ready or not self.current.members:
            return None
        members = tuple(sorted((*self.current.members, *ready)))
        joining = tuple(sorted((*self.current.joining, *ready)))
        self._publish(Membership(self.current.epoch + 1, members, joining))
        return self.current

    def settle_joins(self) -> None:
        """Joiners whose first exchange happened (``q/<e>/start`` set) count as healthy."""
        cur = self.current
        if cur.joining and self.store is not None and self._started(cur.epoch):
            self.current = Membership(cur.epoch, cur.members, ())

    def _started(self, epoch: int) -> bool:
        assert self.store is not None
        if not self.store.check([key_start(epoch)]):
            return False
        try:
            decode(EpochStart, self.store.get(key_start(epoch)))
        except ProtocolError:
            return False
        return True

    @property
    def degraded_below_min(self) -> bool:
        return len(self.healthy) < self.min_replicas

    @property
    def healthy(self) -> tuple[int, ...]:
        return tuple(r for r in self.current.members if r not in self.current.joining)

    # ---- heartbeats --------------------------------------------------------------------------
    def stalled(self) -> StallReport:
        """Members that never entered an exchange the others have waited in too long, with
        the evidence: the late ranks, how long the others waited, the limit."""
        if self.store is None or len(self.current.members) < 2:
            return StallReport()
        looked = self.clock()
        beats = self._heartbeats()
        now = self.clock()
        if self._after_gap(looked, now) or not beats:
            return StallReport()
        front = max(step for step, _ in beats.values())
        waiting = [t for step, t in beats.values() if step == front]
        limit = self.stall_limit()
        waited_s = now - min(waiting)
        late_ranks = tuple(sorted(rank for rank, (step, _) in beats.items() if step < front))
        if limit is None or waited_s < limit:
            return StallReport((), late_ranks, waited_s, limit)
        late = {rank // self.replica_size for rank in late_ranks}
        hung = tuple(sorted(r for r in late if r in self.current.members))
        return StallReport(hung, late_ranks, waited_s, limit)

    def _after_gap(self, looked: float, now: float) -> bool:
        """Whether the coordinator itself stood still: its looks were ``LOOK_GAP_S`` or more
        apart (its process paused, its host swapping) or a look blocked that long (the
        store paused). The ranks then get a grace period before any stall is judged: what
        the coordinator missed meanwhile is no evidence."""
        gap = max(looked - self._looked_at, now - looked) if self._looked_at else 0.0
        self._looked_at = now
        if gap >= LOOK_GAP_S:
            self._grace_until = now + max(gap, self.stall_limit() or 0.0)
        return now < self._grace_until

    def stall_limit(self) -> float | None:
        """Seconds of waiting that mark a stall; None before any step time is known."""
        if not self._step_times:
            return None
        pace = self.stall_factor * statistics.median(self._step_times)
        noise = self.lateness_factor * max(self._lateness, default=0.0)
        return max(pace, noise, self.stall_floor_s)

    def _note_arrivals(self, beats: dict[int, tuple[int, float]]) -> None:
        """Lateness samples: for a step every member rank was seen to enter, how long the
        first to enter waited for the last."""
        for rank, (step, when) in beats.items():
            if step >= FIRST_TIMED_STEP:
                self._arrivals.setdefault(step, {})[rank] = when
        front = max(step for step, _ in beats.values())
        for step in sorted(self._arrivals):
            arrived = self._arrivals[step]
            if all(rank in arrived for rank in beats):
                times = [arrived[rank] for rank in beats]
                self._lateness.append(max(times) - min(times))
                del self._arrivals[step]
            elif not front - 8 <= step <= front:  # a beat overwritten unseen, or a rollback
                del self._arrivals[step]

    def behind(self) -> dict[int, int]:
        """The ranks whose latest heartbeat is behind the others' newest step, with that
        step, as the store holds them now: a peek that records nothing (no arrival, no
        lateness, no look), so that it can be taken often without changing how ``stalled``
        judges."""
        if self.store is None or len(self.current.members) < 2:
            return {}
        ranks = self._beating_ranks()
        keys = [key_heartbeat(rank) for rank in ranks]
        if not self.store.check(keys):
            return {}
        steps = {}
        for rank, raw in zip(ranks, self.store.multi_get(keys), strict=True):
            try:
                steps[rank] = decode(Heartbeat, raw).step
            except ProtocolError:
                continue
        front = max(steps.values(), default=0)
        return {rank: step for rank, step in sorted(steps.items()) if step < front}

    def _beating_ranks(self) -> list[int]:
        """The ranks of the members that are not joining: those whose heartbeats count."""
        return [
            r * self.replica_size + i
            for r in self.current.members
            if r not in self.current.joining
            for i in range(self.replica_size)
        ]

    def _heartbeats(self) -> dict[int, tuple[int, float]]:
        assert self.store is not None
        ranks = self._beating_ranks()
        keys = [key_heartbeat(rank) for rank in ranks]
        if not self.store.check(keys):
            return {}
        seen_at = self.clock()
        beats = {}
        for rank, raw in zip(ranks, self.store.multi_get(keys), strict=True):
            try:
                heartbeat = decode(Heartbeat, raw)
            except ProtocolError:
                continue  # not a beat this service can judge by; the rank looks silent
            seen = self._seen_hb.get(rank)
            if seen is not None and heartbeat.seq < seen[0]:
                heartbeat = Heartbeat(seen[0], seen[1])  # an old beat put back: ignored
            if seen is None or seen[0] != heartbeat.seq:  # new: it arrived by now, our clock
                seen = (heartbeat.seq, heartbeat.step, seen_at)
                self._seen_hb[rank] = seen
            beat = (seen[1], seen[2])
            previous = self._last_hb.get(rank)
            if previous is not None and 0 < beat[0] - previous[0] <= MAX_STEPS_BETWEEN_LOOKS:
                # steps faster than the looks: their mean over the steps seen to pass
                self._step_times.append((beat[1] - previous[1]) / (beat[0] - previous[0]))
            self._last_hb[rank] = beat
            beats[rank] = beat
        self._note_arrivals(beats)
        return beats

    def forget_heartbeats(self, ranks: Sequence[int]) -> None:
        """A relaunched rank starts a fresh heartbeat history."""
        if self.store is None:
            return
        for rank in ranks:
            self._last_hb.pop(rank, None)
            self._seen_hb.pop(rank, None)
            for arrived in self._arrivals.values():
                arrived.pop(rank, None)
            self.store.delete_key(key_heartbeat(rank))

    def successor(self, log: MembershipLog | None = None) -> QuorumService:
        """A new coordinator with this one's settings that resumes from ``log`` (by default
        this one's): its store address, newest epoch and expected joiners (start it)."""
        return QuorumService(
            self.replicas,
            self.replica_size,
            host=self.host,
            min_replicas=self.min_replicas,
            stall_factor=self.stall_factor,
            stall_floor_s=self.stall_floor_s,
            lateness_factor=self.lateness_factor,
            clock=self.clock,
            log=log or self.log,
            secret=self.secret,
        )

    def close(self) -> None:
        self.store = None


def _join(raw: bytes) -> tuple[int, int] | None:
    """``(replica, incarnation)`` of a join request; None for a value that is not one."""
    try:
        request = decode(JoinRequest, raw)
    except ProtocolError:
        return None
    return request.replica, request.incarnation
