"""The quorum service against a real TCPStore: epochs, breaks, joins and heartbeats."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import TypeVar

import pytest

from ft_runtime import _dist as dist
from ft_runtime.quorum import Membership, QuorumService, key_broken, key_members, key_start
from ft_runtime.replica.auth import JobSecret
from ft_runtime.replica.protocol import (
    KEY_EPOCH,
    EpochBroken,
    EpochPointer,
    EpochStart,
    Heartbeat,
    JoinRequest,
    decode,
    decode_membership,
    encode,
    first_beat,
    key_heartbeat,
    key_join,
)
from ft_runtime.replica.store import SealedStore

_SEQ: dict[tuple[int, int], int] = {}


def set_beat(store, rank: int, step: int) -> None:
    """What a rank writes as it enters the exchange of ``step``: a new beat, no time."""
    seq = _SEQ[id(store), rank] = _SEQ.get((id(store), rank), 0) + 1
    store.set(key_heartbeat(rank), encode(Heartbeat(seq, step)))


@pytest.fixture
def quorum(clock):
    service = QuorumService(replicas=3, replica_size=2, clock=clock, stall_floor_s=0.1)
    service.start()
    yield service
    service.close()


T = TypeVar("T")


def eventually(poll: Callable[[], T | None], timeout_s: float = 5.0) -> T | None:
    """Polls until a result comes: SETs from another connection arrive asynchronously."""
    deadline = time.monotonic() + timeout_s
    while (result := poll()) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    return result


def client(service: QuorumService) -> SealedStore:
    """A rank's connection: it holds the job's secret."""
    host, _, port = service.address.rpartition(":")
    raw = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=5))
    return SealedStore(raw, JobSecret(service.secret))


def test_epoch_zero_holds_every_replica_and_ranks_can_read_it(quorum) -> None:
    store = client(quorum)
    assert decode(EpochPointer, store.get(KEY_EPOCH)) == EpochPointer(0)
    assert decode_membership(0, store.get(key_members(0))).members == (0, 1, 2)


def test_removing_a_replica_breaks_the_epoch_and_publishes_the_next(quorum) -> None:
    store = client(quorum)
    new = quorum.remove(1, "rank 3 exited")
    assert new == Membership(1, (0, 2))
    assert decode(EpochBroken, store.get(key_broken(0))) == EpochBroken("rank 3 exited")
    assert eventually(lambda: decode(EpochPointer, store.get(KEY_EPOCH)).epoch == 1 or None)
    assert not store.check([key_broken(1)])
    assert quorum.remove(1, "again") is None  # not a member any more


def test_a_relaunched_replica_is_admitted_as_joining_then_healthy(quorum) -> None:
    store = client(quorum)
    quorum.remove(2, "died")
    quorum.expect(2, incarnation=1)
    assert quorum.poll_joins() is None  # its ranks have not said they are ready
    store.set(key_join(2), encode(JoinRequest(2, 0)))  # a stale incarnation does not count
    assert quorum.poll_joins() is None
    store.set(key_join(2), "1")  # nor a value that is no join request
    assert quorum.poll_joins() is None
    store.set(key_join(2), encode(JoinRequest(2, 1)))
    joined = eventually(quorum.poll_joins)
    assert joined == Membership(2, (0, 1, 2), (2,))
    assert joined.source == 0
    assert quorum.healthy == (0, 1)
    store.set(key_start(2), encode(EpochStart(40)))  # the source published: the join is done
    # A SET on another connection is not acknowledged: the service sees it on a later poll.
    deadline = time.monotonic() + 5
    while quorum.healthy != (0, 1, 2) and time.monotonic() < deadline:
        quorum.settle_joins()
        time.sleep(0.01)
    assert quorum.healthy == (0, 1, 2)


def test_a_replica_that_never_enters_the_exchange_is_found_stalled(quorum, clock) -> None:
    store = quorum.store  # the service's own connection: the beats arrive in order

    def beat(step: int, ranks: range) -> None:
        for rank in ranks:
            set_beat(store, rank, step)

    for step in range(5):  # steady state: 0.1 s per step for everyone
        beat(step, range(6))
        assert quorum.stalled().replicas == ()
        clock.advance(0.1)
    beat(5, range(4))  # replicas 0 and 1 wait at step 5; replica 2 (ranks 4, 5) is stuck
    assert quorum.stalled().replicas == ()  # seen as they arrive: the wait counts on this clock
    clock.advance(0.08)
    early = quorum.stalled()
    assert early.replicas == ()  # within the limit of one median step
    assert early.late_ranks == (4, 5)  # but named already: a stopped one needs no limit
    clock.advance(0.04)
    assert quorum.stall_limit() == pytest.approx(0.1)
    assert quorum.stalled().replicas == (2,)


def test_after_a_whole_job_restart_an_old_process_late_beat_hides_no_new_one(quorum, clock) -> None:
    # Seen across hosts: the restart stops the ranks without waiting for them, and ranks
    # 0 to 3 wrote one more beat (step 31) after the quorum forgot them. Their new
    # processes beat from step 20, the checkpoint's; counted from 1 those beats were taken
    # for old values put back, and the rank that never wrote a late one (replica 2)
    # looked late at step 20 against a front of 31: fenced 52 ms into a healthy exchange.
    store = quorum.store
    for step in range(5):
        for rank in range(6):
            store.set(key_heartbeat(rank), encode(Heartbeat(first_beat(0) + step + 1, step)))
        quorum.stalled()
        clock.advance(0.1)
    quorum.restart_all("test")
    for rank in range(4):  # the old processes' last beats, after the forgetting
        store.set(key_heartbeat(rank), encode(Heartbeat(first_beat(0) + 31, 31)))
    for rank in (4, 5):  # replica 2's new processes enter the exchange of step 20 first
        store.set(key_heartbeat(rank), encode(Heartbeat(first_beat(1) + 1, 20)))
    quorum.stalled()  # every rank has a beat: the old ones are seen
    for rank in range(4):  # then the others' new processes
        store.set(key_heartbeat(rank), encode(Heartbeat(first_beat(1) + 1, 20)))
    assert quorum.stalled().late_ranks == ()
    clock.advance(5.0)
    assert quorum.stalled().replicas == ()  # all wait together at step 20: nobody is late


def lateness_run(quorum, clock, lateness: float, steps: int = 8) -> None:
    """Steps of 0.1 s in which replica 2 enters each exchange ``lateness`` s after the
    others; the quorum polls after every arrival, as the controller does."""
    store = quorum.store
    for step in range(steps):
        for rank in range(4):
            set_beat(store, rank, step)
        assert quorum.stalled().replicas == ()
        clock.advance(lateness)
        for rank in (4, 5):
            set_beat(store, rank, step)
        assert quorum.stalled().replicas == ()
        clock.advance(0.1 - lateness)


def test_the_stall_limit_widens_with_the_lateness_of_healthy_members(quorum, clock) -> None:
    lateness_run(quorum, clock, lateness=0.08)
    # One median step (0.1 s) would take a 0.12 s straggler for a hang; twice the worst
    # lateness seen (0.16 s) does not.
    assert quorum.stall_limit() == pytest.approx(0.16)
    for rank in range(4):
        set_beat(quorum.store, rank, 8)
    assert quorum.stalled().replicas == ()
    clock.advance(0.12)
    assert quorum.stalled().replicas == ()
    clock.advance(0.05)
    assert quorum.stalled().replicas == (2,)


def test_start_up_steps_are_no_sample_of_lateness(quorum, clock) -> None:
    store = quorum.store
    for rank in range(6):  # the ranks start seconds apart: step 0 is no sign of noise
        set_beat(store, rank, 0)
        quorum.stalled()
        clock.advance(1.0)
    for step in range(1, 6):
        for rank in range(6):
            set_beat(store, rank, step)
        quorum.stalled()
        clock.advance(0.1)
    assert quorum.stall_limit() == pytest.approx(0.1)


def test_a_steady_job_has_the_floor_as_its_least_limit(clock) -> None:
    service = QuorumService(replicas=2, replica_size=1, clock=clock, stall_floor_s=0.3)
    service.start()
    try:
        for step in range(5):
            for rank in range(2):
                set_beat(service.store, rank, step)
            assert service.stalled().replicas == ()
            clock.advance(0.1)
        assert service.stall_limit() == pytest.approx(0.3)
    finally:
        service.close()


def test_membership_round_trips_through_json() -> None:
    m = Membership(4, (0, 2, 3), (3,))
    assert Membership.from_json(4, m.to_json()) == m
    assert m.source == 0
    assert Membership(1, (2,), (2,)).source == -1


def test_after_a_gap_in_its_own_looks_the_coordinator_gives_a_grace_period(quorum, clock) -> None:
    store = quorum.store

    def beat(step: int, ranks: range) -> None:
        for rank in ranks:
            set_beat(store, rank, step)

    for step in range(5):
        beat(step, range(6))
        assert quorum.stalled().replicas == ()
        clock.advance(0.1)
    beat(5, range(4))  # replica 2 is late at step 5 ...
    clock.advance(6.0)  # ... while the coordinator was paused for 6 s
    assert quorum.stalled().replicas == ()  # what it missed is no evidence: a grace period
    for _ in range(11):  # looking steadily again, within the grace (as long as the gap)
        clock.advance(0.5)
        assert quorum.stalled().replicas == ()
    clock.advance(0.6)
    assert quorum.stalled().replicas == (2,)  # seen stuck after the grace: a stall
