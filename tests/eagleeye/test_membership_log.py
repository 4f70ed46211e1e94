"""The quorum coordinator's memory in the run store: recorded before published, resumed."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

from eagleeye.store import RunReader, RunStore, StoreMembershipLog
from ft_runtime import _dist as dist
from ft_runtime.membership import Membership, QuorumRecord
from ft_runtime.quorum import QuorumService, key_members
from ft_runtime.replica.protocol import (
    KEY_EPOCH,
    EpochPointer,
    JoinRequest,
    decode,
    decode_membership,
    encode,
    key_join,
)


def test_a_record_reads_back_as_it_was_written(tmp_path) -> None:
    store = RunStore(tmp_path)
    log = StoreMembershipLog(store)
    assert log.last() is None
    log.record(QuorumRecord(Membership(0, (0, 1, 2)), "127.0.0.1:1234"), time=1.0)
    newest = QuorumRecord(Membership(4, (0, 2), joining=(2,)), "127.0.0.1:1234", {1: 3})
    log.record(newest, time=2.0)
    assert log.last() == newest
    store.close()
    with RunReader(tmp_path) as reader:
        table = reader.memberships()
    assert list(table["epoch"]) == [0, 4]
    assert table["joining"].iloc[-1] == [2]


def test_a_new_coordinator_on_the_same_run_resumes_the_epochs_and_the_store(tmp_path) -> None:
    first_store = RunStore(tmp_path)
    first = QuorumService(3, 1, log=StoreMembershipLog(first_store))
    address = first.start()  # hosts the store itself; in a job a store process outlives it
    host, _, port = address.rpartition(":")
    ranks = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=5))
    first.remove(1, "rank 1 exited")
    first.expect(1, incarnation=1)
    held = first.store  # the store lives on, as the store process would
    first.store = None  # the coordinator is gone
    first_store.close()

    second_store = RunStore(tmp_path)
    second = QuorumService(3, 1, log=StoreMembershipLog(second_store))
    assert second.start() == address
    assert second.resumed
    assert second.current == Membership(1, (0, 2))
    ranks.set(key_join(1), encode(JoinRequest(1, 1)))  # the relaunched replica says it is ready
    deadline = time.monotonic() + 5  # the SET arrives over another connection
    while (admitted := second.poll_joins()) is None and time.monotonic() < deadline:
        time.sleep(0.01)  # admitted only because the expected incarnation came from the log
    assert admitted == Membership(2, (0, 1, 2), joining=(1,))
    assert decode(EpochPointer, ranks.get(KEY_EPOCH)) == EpochPointer(2)
    assert decode_membership(2, ranks.get(key_members(2))) == admitted
    second_store.close()
    del held


def test_restarting_without_a_record_is_refused(tmp_path) -> None:
    from ft_runtime.layout import JobLayout
    from ft_runtime.replica import ReplicaSupervisor
    from ft_runtime.supervisor import LaunchSpec

    spec = LaunchSpec(["-c", "pass"], JobLayout(2, 1, 2), "t", str(tmp_path))
    sup = ReplicaSupervisor(spec, QuorumService(2, 1))
    with pytest.raises(RuntimeError, match="no membership log"):
        sup.restart_coordinator("test")


def test_a_resumed_runs_log_starts_a_new_quorum_on_a_store_of_its_own(tmp_path) -> None:
    """`eagleeye run --resume` of a replica-mode run: the store process its records name
    ended with the killed controller; connecting there waited 30 s and crashed the run."""
    store = RunStore(tmp_path)
    StoreMembershipLog(store).record(
        QuorumRecord(Membership(3, (0, 1)), "127.0.0.1:9"), time=1.0
    )  # a store address nobody listens on
    quorum = QuorumService(2, 1, log=StoreMembershipLog(store, fresh=True))
    address = quorum.start()  # before: DistNetworkError after the 30 s connect timeout
    assert address != "127.0.0.1:9"
    assert not quorum.resumed
    assert quorum.current.members == (0, 1)
    quorum.close()
    newest = StoreMembershipLog(store).last()
    assert newest is not None
    assert newest.store_address == address  # a restart of this run's coordinator finds it
    store.close()
