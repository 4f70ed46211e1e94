"""The public rank API (Manager, OptimizerWrapper, ReplicaSampler) in one process: a real
quorum service and TCPStore, ranks on threads, a replica that dies and catches up.

No sleep stands for a duration: threads meet on barriers and events, and the coordinator
is polled as the controller polls it.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from ft_runtime.ftar import ReplicaComm
from ft_runtime.quorum import QuorumService
from ft_runtime.replica import Manager, OptimizerWrapper, ReplicaSampler
from ft_runtime.replica.auth import JobSecret
from ft_runtime.replica.store import connect

pytestmark = pytest.mark.timeout(180)
TOKEN = "catch-up-token-0123456789abcdef"


OPEN: list[Rank] = []


@pytest.fixture(autouse=True)
def _close_ranks():
    """Every rank's snapshot server is closed after its test, passed or failed: its
    threads must not linger into other tests."""
    yield
    while OPEN:
        OPEN.pop().manager.close()


def dataset() -> TensorDataset:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(512, 4, generator=generator)
    return TensorDataset(x, x.sum(dim=1, keepdim=True))


class Rank:
    """A training script's pieces, as a user writes them, on a thread."""

    def __init__(
        self, quorum: QuorumService, replica: int, incarnation: int = 0, **callbacks: Any
    ) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        comm = ReplicaComm(
            connect(quorum.address, JobSecret(quorum.secret)),
            quorum.address,
            replica=replica,
            replica_rank=0,
            replica_size=1,
            num_replicas=2,
            incarnation=incarnation,
            token=TOKEN,
        )
        self.manager = Manager(
            state_dict=lambda: {"model": self.model.state_dict(), "optim": optimizer.state_dict()},
            load_state_dict=self.load,
            comm=comm,
            **callbacks,
        )
        comm.state_fn = self.manager._state_dict
        comm.source.state_fn = self.manager._state_dict
        self.optimizer = OptimizerWrapper(self.manager, optimizer)
        self.sampler = ReplicaSampler(dataset(), self.manager, batch_size=4, seed=0)
        self.loader = DataLoader(dataset(), batch_size=4, sampler=self.sampler)
        self.trained: list[int] = []  # this replica's batches, in the order trained
        OPEN.append(self)
        self.members: list[int] = []

    def load(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optim"])

    def train(self, until: Callable[[Rank], bool]) -> None:
        while not until(self):
            for x, y in self.loader:
                self.optimizer.zero_grad()
                batch, joining = self.manager.batch, self.manager.joining
                loss = torch.nn.functional.mse_loss(self.model(x), y)
                loss.backward()
                self.optimizer.step()
                self.members.append(self.manager.comm.membership.members.__len__())
                if not joining:
                    self.trained.append(batch)
                if until(self):
                    return

    def params(self) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1) for p in self.model.parameters()])


def run(threads: list[threading.Thread], errors: list[BaseException]) -> None:
    for t in threads:
        t.start()


def guarded(errors: list[BaseException], fn: Callable[[], None]) -> Callable[[], None]:
    def body() -> None:
        try:
            fn()
        except BaseException as exc:
            errors.append(exc)

    return body


def test_two_replicas_train_in_step_and_each_batch_once() -> None:
    quorum = QuorumService(replicas=2, replica_size=1)
    quorum.start()
    ranks = [Rank(quorum, r) for r in range(2)]
    errors: list[BaseException] = []
    threads = [
        threading.Thread(
            target=guarded(errors, lambda r=r: r.train(lambda s: s.manager.step >= 12))
        )
        for r in ranks
    ]
    run(threads, errors)
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert torch.equal(ranks[0].params(), ranks[1].params())
    for rank in ranks:
        assert rank.trained == list(range(12))
        assert rank.manager.comm.next_batch(0) == 12
        rank.manager.close()
    # the two replicas read different samples
    assert ranks[0].sampler.indices(0) != ranks[1].sampler.indices(0)
    quorum.close()


def test_a_replica_that_dies_catches_up_and_ends_bitwise_equal() -> None:
    quorum = QuorumService(replicas=2, replica_size=1)
    quorum.start()
    survivor, victim = Rank(quorum, 0), Rank(quorum, 1)
    errors: list[BaseException] = []
    final: dict[str, int] = {}

    def keep_pace(rank: Rank) -> None:
        """A source alone on two cores can outrun a joiner's replay until its update log
        overflows (the joiner would then restart its catch-up): the survivor waits while
        it is more than 20 logged updates ahead of what the joiner fetched."""
        server = rank.manager.comm.server
        while rank.manager.comm.source.serving and not errors:
            snapshots = list(server.snapshots.values())
            fetched = [step for step, entry in list(server.log.items()) if entry._digest]
            done = max(fetched, default=snapshots[0].step - 1 if snapshots else rank.manager.step)
            if rank.manager.step - done <= 20:
                return
            threading.Event().wait(0.002)

    def until_final(rank: Rank) -> bool:
        if rank is survivor:
            keep_pace(rank)
        if "step" not in final and rank.members and rank.members[-1] == 2 and rank.manager.step > 6:
            final["step"] = rank.manager.step + 5  # set once both train together again
        return "step" in final and rank.manager.step >= final["step"] or rank.manager.step > 100_000

    died = threading.Event()

    def victim_body() -> None:
        victim.train(lambda s: s.manager.step >= 4)
        victim.manager.close()
        died.set()  # its thread ends: as if its process were killed

    threads = [
        threading.Thread(target=guarded(errors, lambda: survivor.train(until_final))),
        threading.Thread(target=guarded(errors, victim_body)),
    ]
    run(threads, errors)
    assert died.wait(60)
    quorum.remove(1, "rank 1 exited")  # what the supervisor does on the exit
    quorum.expect(1, incarnation=1)
    joiner = Rank(quorum, 1, incarnation=1)
    joiner_thread = threading.Thread(target=guarded(errors, lambda: joiner.train(until_final)))
    joiner_thread.start()
    deadline = time.monotonic() + 120
    while joiner_thread.is_alive() and time.monotonic() < deadline and not errors:
        quorum.poll_joins()  # the controller's tick
        quorum.settle_joins()
        joiner_thread.join(0.01)
    threads[0].join(60)
    assert not errors, errors
    assert joiner.manager.joined_at is not None
    assert survivor.manager.step == joiner.manager.step == final["step"]
    assert torch.equal(survivor.params(), joiner.params())
    # every batch of each replica trained exactly once, in order, none skipped
    assert survivor.trained == list(range(len(survivor.trained)))
    replica1 = victim.trained + joiner.trained
    assert replica1 == list(range(len(replica1)))
    assert joiner.manager.comm.next_batch(0) == len(replica1)
    for rank in (survivor, joiner):
        rank.manager.close()
    quorum.close()


def test_commands_reach_every_replica_after_the_same_step() -> None:
    """The controller's skip_batch for replica 1 and a checkpoint (which this script does
    not take: refused), sent while both replicas wait at a barrier after step 3."""
    from ft_runtime.replica import protocol as p

    quorum = QuorumService(replicas=2, replica_size=1)
    quorum.start()
    store = quorum.store
    assert store is not None
    ranks = [Rank(quorum, r) for r in range(2)]
    gate = threading.Barrier(3)
    errors: list[BaseException] = []

    def until(rank: Rank) -> bool:
        if rank.manager.step == 4 and not getattr(rank, "paused", False):
            rank.paused = True  # type: ignore[attr-defined]
            gate.wait(60)  # the controller writes its commands now
            gate.wait(60)
        return rank.manager.step >= 10

    threads = [threading.Thread(target=guarded(errors, lambda r=r: r.train(until))) for r in ranks]
    run(threads, errors)
    gate.wait(60)
    for number, command in enumerate(
        (p.Command(1, "skip_batch", replicas=(1,)), p.Command(2, "checkpoint")), start=1
    ):
        store.set(p.key_command(number), p.encode(command))
        store.add(p.KEY_COMMANDS, 1)
    gate.wait(60)
    for t in threads:
        t.join(120)
    assert not errors, errors
    answers = {
        (n, r): p.decode_answer(store.get(p.key_answer(n, r))) for n in (1, 2) for r in (0, 1)
    }
    skipped = answers[1, 1]
    assert isinstance(skipped, p.Skipped)
    assert isinstance(answers[1, 0], p.Refused)  # not named by the command
    assert isinstance(answers[2, 0], p.Refused)
    assert isinstance(answers[2, 1], p.Refused)
    assert ranks[0].trained == list(range(10))
    assert skipped.batch not in ranks[1].trained
    assert sorted([*ranks[1].trained, skipped.batch]) == list(range(11))
    assert torch.equal(ranks[0].params(), ranks[1].params())
    for rank in ranks:
        rank.manager.close()
    quorum.close()


def test_a_job_restart_trains_every_batch_once_since_the_restored_checkpoint() -> None:
    """Both replicas die; the whole job restarts from the checkpoint the source saved (with
    the manager's state_dict) and trains each batch once since it."""
    quorum = QuorumService(replicas=2, replica_size=1)
    quorum.start()
    saved: dict[str, dict] = {}
    errors: list[BaseException] = []

    def first(rank: Rank) -> bool:
        if rank.manager.step == 4 and rank.manager.is_saving_rank() and "ckpt" not in saved:
            saved["ckpt"] = copy.deepcopy(  # as torch.save would: training goes on
                {
                    "model": rank.model.state_dict(),
                    "optim": rank.optimizer.state_dict(),
                    "manager": rank.manager.state_dict(),
                }
            )
        return rank.manager.step >= 7

    ranks = [Rank(quorum, r) for r in range(2)]
    threads = [threading.Thread(target=guarded(errors, lambda r=r: r.train(first))) for r in ranks]
    run(threads, errors)
    for t in threads:
        t.join(120)
    assert not errors, errors
    for rank in ranks:
        rank.manager.close()
    assert saved["ckpt"]["manager"]["step"] == 4
    assert saved["ckpt"]["manager"]["marks"] == [4, 4]

    quorum.restart_all("both replicas died")
    again = [Rank(quorum, r, incarnation=1) for r in range(2)]
    for rank in again:  # what the script does with its own checkpoint at start (each
        rank.load(copy.deepcopy(saved["ckpt"]))  # process reads its own copy of the file)
    threads = [
        threading.Thread(
            target=guarded(
                errors,
                lambda r=r: (
                    r.manager.load_state_dict(saved["ckpt"]["manager"]),
                    r.train(lambda s: s.manager.step >= 10),
                ),
            )
        )
        for r in again
    ]
    run(threads, errors)
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert torch.equal(again[0].params(), again[1].params())
    for rank in again:
        assert rank.trained == list(range(4, 10))  # once since the checkpoint's position
        assert rank.manager.comm.next_batch(0) == 10
        rank.manager.close()
    quorum.close()


@pytest.mark.parametrize("late", [False, True], ids=["in_time", "late_marks"])
def test_checkpoint_and_rollback_commands_through_the_callbacks(late: bool) -> None:
    """The controller asks for a checkpoint after step 4 (the source saves, the other
    refuses) and later rolls back to it with half the lr: both replicas restore the same
    state and data position, and train every batch once since it. ``late``: replica 1
    writes its ledger marks of step 8 (replica 0's batch 8 among them) half a second
    after the exchange, when replica 0 has already rolled back and forgotten it (seen on
    a loaded host: replica 0 then skipped batch 8)."""
    from ft_runtime.replica import protocol as p

    quorum = QuorumService(replicas=2, replica_size=1)
    quorum.start()
    store = quorum.store
    assert store is not None
    disk: dict[int, dict] = {}  # the one checkpoint folder every replica reads
    ranks: list[Rank] = []

    def callbacks(replica: int) -> dict[str, Any]:
        def save(step: int) -> str:
            rank = ranks[replica]
            disk[step] = copy.deepcopy(
                {
                    "model": rank.model.state_dict(),
                    "optim": rank.optimizer.state_dict(),
                    "manager": rank.manager.state_dict(),
                }
            )
            return f"memory://{step}"

        def load(at_most: int) -> int | None:
            steps = [s for s in disk if s <= at_most]
            if not steps:
                return None
            state = copy.deepcopy(disk[max(steps)])
            ranks[replica].load(state)
            ranks[replica].manager.load_state_dict(state["manager"])
            return max(steps)

        return {"save_checkpoint": save, "load_checkpoint": load}

    ranks.extend(Rank(quorum, r, **callbacks(r)) for r in range(2))
    if late:
        ledger = ranks[1].manager.comm.ledger
        mark_in_time = ledger.mark_trained

        def mark_late(trained):
            trained = list(trained)
            if (0, 8) in trained and not getattr(ledger, "was_late", False):
                ledger.was_late = True  # type: ignore[attr-defined]
                time.sleep(0.5)
            mark_in_time(trained)

        ledger.mark_trained = mark_late  # type: ignore[method-assign]
    gate = threading.Barrier(3)
    errors: list[BaseException] = []
    pauses = {4: "checkpoint", 8: "rollback"}

    def until(rank: Rank) -> bool:
        step = rank.manager.step
        done = getattr(rank, "paused", set())
        if step in pauses and step not in done and len(rank.trained) == step:
            rank.paused = done | {step}  # type: ignore[attr-defined]
            gate.wait(60)  # the controller writes its command now
            gate.wait(60)
        return len(rank.trained) >= 14

    threads = [threading.Thread(target=guarded(errors, lambda r=r: r.train(until))) for r in ranks]
    run(threads, errors)
    for number, command in enumerate(
        (p.Command(1, "checkpoint"), p.Command(2, "rollback", step=2**62, lr_factor=0.5)),
        start=1,
    ):
        gate.wait(60)
        store.set(p.key_command(number), p.encode(command))
        store.add(p.KEY_COMMANDS, 1)
        gate.wait(60)
    for t in threads:
        t.join(120)
    assert not errors, errors
    answers = {
        (n, r): p.decode_answer(store.get(p.key_answer(n, r))) for n in (1, 2) for r in (0, 1)
    }
    assert answers[1, 0] == p.Saved(4, "memory://4")  # after the step whose exchange agreed
    assert isinstance(answers[1, 1], p.Refused)
    assert answers[2, 0] == answers[2, 1] == p.Restored(4, 8, 0.5)
    assert torch.equal(ranks[0].params(), ranks[1].params())
    for rank in ranks:
        # steps 0..8 trained batches 0..8; the rollback to the checkpoint after step 4
        # (position 5) trains 5.. again, each once since the checkpoint
        assert rank.trained == [*range(9), *range(5, 10)]
        assert rank.manager.lr_factor == 0.5
        rank.manager.close()
    quorum.close()
