"""The fault-tolerant all-reduce across replicas, with a replica-internal two-phase commit.

Each rank of replica r exchanges its slice of the replica's gradient with the ranks of the
same replica rank in the other member replicas, over a gloo group built per membership
epoch on a fresh ``PrefixStore`` of the quorum's store (the controller hosts it, so it
survives any rank). One all-reduce per step carries the gradient slice plus a small
control vector, one slot per replica: whether it contributed a gradient, which of its
batches, the newest epoch it has seen, its step, its presence and how many control
commands (``ctl/<n>``, written by the supervisor) it has seen. After the sum every member
knows all of these, so the average is over actual contributors, and the next epoch and
the commands to run after this step are agreed without another round trip. The vector's
rows are ``protocol.CONTROL_FIELDS``, read back by name through ``ExchangeSummary``, which
refuses a sum that is not whole, finite counts.

A failure of that all-reduce (a peer's "connection reset", the quorum marking the epoch
broken, or a timeout as the last resort) fails the step for this rank; the replica's ranks
then vote (phase one) and apply the update only when all of them completed the exchange
(phase two). Otherwise they discard it, wait for the next epoch and redo the exchange with
the gradient they kept, so replicas may legitimately be at different steps for a moment.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch

from ft_runtime import _dist as dist
from ft_runtime.catchup import SERVE_NICE, SnapshotServer
from ft_runtime.errors import LeftQuorum
from ft_runtime.quorum import Membership
from ft_runtime.rejoin import Apply, CatchUpClient, CatchUpSource
from ft_runtime.replica.control import CommandInbox
from ft_runtime.replica.ledger import Ledger
from ft_runtime.replica.protocol import (
    CONTROL_FIELDS,
    KEY_EPOCH,
    Answer,
    Command,
    ControlSlot,
    EpochPointer,
    EpochStart,
    ExchangeSummary,
    Heartbeat,
    JoinRequest,
    ProtocolError,
    ServerAddress,
    decode,
    decode_membership,
    encode,
    first_beat,
    key_address,
    key_broken,
    key_heartbeat,
    key_join,
    key_members,
    key_start,
    prefix_cross,
    prefix_intra,
)
from ft_runtime.replica.store import SealedStore

_FIELDS = len(CONTROL_FIELDS)


@dataclass(frozen=True, slots=True)
class ExchangeResult:
    """What one committed exchange was: who contributed and under which epoch."""

    epoch: int
    members: int
    contributors: int
    retries: int
    lr_scale: float
    trained: tuple[tuple[int, int], ...] = ()
    """``(replica, batch)`` of every replica that contributed its batch."""


class ReplicaComm:
    """One rank's side of replica-level fault tolerance.

    Args:
        store: a sealed client of the quorum's store (``replica.store.connect``).
        store_address: ``host:port`` of that store (new clients are made for group set-up).
        replica, replica_rank, replica_size, num_replicas: where this rank sits.
        incarnation: how often this replica was relaunched; above 0 it must catch up.
        state_fn: returns the state a joiner needs (model, optimizer), called at a step
            boundary when this rank is the source of a catch-up.
        cross_timeout_s: last-resort timeout of a cross-replica exchange.
        lr_scaling: scale the lr by sqrt(contributors / replicas) while some are missing.
        serve_nice: nice levels below this thread at which the catch-up server's threads
            run (``SnapshotServer``).
        serve_host: the address the catch-up server binds, which its peers reach it at.
    """

    def __init__(
        self,
        store: SealedStore,
        store_address: str,
        replica: int,
        replica_rank: int,
        replica_size: int,
        num_replicas: int,
        incarnation: int = 0,
        state_fn: Callable[[], Mapping[str, Any]] = dict,
        cross_timeout_s: float = 30.0,
        intra_timeout_s: float = 120.0,
        lr_scaling: bool = True,
        token: str = "",
        serve_nice: int = SERVE_NICE,
        serve_host: str = "127.0.0.1",
    ) -> None:
        self.store, self.store_address = store, store_address
        self.replica, self.replica_rank = replica, replica_rank
        self.replica_size, self.num_replicas = replica_size, num_replicas
        self.rank = replica * replica_size + replica_rank
        self.incarnation = incarnation
        self.state_fn = state_fn
        self.cross_timeout_s = cross_timeout_s
        self.lr_scaling = lr_scaling
        self.token = token
        self.intra: dist.Group | None = None
        self._clients: list[SealedStore] = []  # groups call back into them: kept alive
        self._epoch_high = 0
        if replica_size > 1:
            prefix = dist.PrefixStore(prefix_intra(replica, incarnation), self._client())
            self.intra = dist.gloo_group(prefix, replica_rank, replica_size, intra_timeout_s)
        self.server = SnapshotServer(serve_host, token=token, serve_nice=serve_nice)
        store.set(key_address(self.rank), encode(ServerAddress.parse(self.server.address)))
        self.membership = self._latest()  # epoch 0, or the epoch a job restart published
        self._cross: dist.Group | None = None
        self._cross_epoch = -1
        self._pending: Membership | None = None
        self._published = -1
        self._zero_next = False
        self._abandoned: list[object] = []
        self._catching_up: CatchUpClient | None = None
        self.replayed = 0
        self.source = CatchUpSource(store, self.server, replica, state_fn)
        self.ledger = Ledger(store, replica, writer=replica_rank == 0)
        self.inbox = CommandInbox(store, replica, writer=replica_rank == 0)
        self._beats = first_beat(incarnation)  # above the beats of the process before

    @property
    def must_join(self) -> bool:
        """Whether this replica has to catch up from a peer (it is not in the epoch); a
        relaunched replica that is a member was relaunched with the whole job instead."""
        return self.replica not in self.membership.members or self.replica in (
            self.membership.joining
        )

    # ---- joining -------------------------------------------------------------------------------
    def join(
        self,
        load: Callable[[dict[str, Any]], None],
        apply: Apply,
        timeout_s: float = 300.0,
        ready: Callable[[], None] = lambda: None,
    ) -> int:
        """Catches up with a healthy peer without stalling it, then asks to be admitted.

        ``load`` receives the peer's snapshot; ``apply(update, lr)`` replays one logged step.
        ``ready()`` runs once the state is loaded, just before asking to be admitted.
        Returns the first step this replica trains with the others; the first exchange
        from there sends a zero gradient.
        """
        deadline = time.monotonic() + timeout_s
        source = self._latest().source
        client = CatchUpClient(self.store, self.replica, self.replica_rank, self.token)
        client.request(source, source * self.replica_size + self.replica_rank, self.incarnation)
        step, state = client.snapshot(deadline)
        load(state)
        step = client.replay(step, None, apply, deadline)
        ready()
        if self.replica_rank == 0:
            self.store.set(
                key_join(self.replica), encode(JoinRequest(self.replica, self.incarnation))
            )
        while True:  # keep up with the source until the quorum admits this replica
            membership = self._latest()
            if self.replica in membership.joining and self.store.check(
                [key_start(membership.epoch)]
            ):
                break
            if time.monotonic() > deadline:
                raise LeftQuorum(f"replica {self.replica} was not admitted in {timeout_s:.0f} s")
            step = client.replay(step, None, apply, deadline)
            time.sleep(0.005)
        start = decode(EpochStart, self.store.get(key_start(membership.epoch))).step
        self.replayed = client.replay(step, start, apply, deadline) - step
        self.membership = membership
        self._zero_next = True
        self._catching_up = client
        return start

    def next_batch(self, start: int = 0, replica: int | None = None) -> int:
        """A replica's (this one's by default) first batch not yet trained (exactly-once
        accounting); ``start`` is where to begin looking."""
        return self.ledger.next_batch(start, replica)

    def skip_batch(self, batch: int) -> None:
        """Records that this replica skipped ``batch`` (it counts as consumed, untrained)."""
        self.ledger.skip(batch)

    def forget_batches(self, start: int) -> None:
        """After a restore: batches from ``start`` on were trained into a state that is
        gone, so they are this replica's to train again."""
        self.ledger.forget_from(start)

    def unmark_batch(self, batch: int) -> None:
        """Unmarks this replica's ``batch``: trained into a state a restore undid, marked
        again by another replica that committed that step later than this one forgot it."""
        self.ledger.unmark(batch)

    # ---- the exchange --------------------------------------------------------------------------
    def exchange(self, flat: torch.Tensor, step: int, batch: int) -> ExchangeResult:
        """Averages ``flat`` (this rank's gradient) over the contributing replicas, in place.

        Returns only once the replica committed; raises LeftQuorum when this replica must
        restart (isolated, or behind the others).
        """
        self._beats += 1
        self.store.set(key_heartbeat(self.rank), encode(Heartbeat(self._beats, step)))
        contributing = not self._zero_next
        if not contributing:
            flat.zero_()
        if self.intra is not None:
            self.intra.allreduce([flat]).wait()
            flat /= self.replica_size
        chunk = flat.tensor_split(self.replica_size)[self.replica_rank]
        kept = chunk.clone()
        retries = 0
        while True:
            if self._pending is not None:
                self._switch(self._pending)
            control = self._control(contributing, batch, step)
            buffer = torch.cat([kept, control])
            ok = self._cross_allreduce(buffer)
            summary = _summary(buffer[kept.numel() :], self.num_replicas) if ok else None
            # A member at another step missed or made a commit the others did not: nobody
            # applies this sum, and the one behind restarts and catches up.
            behind = summary is not None and summary.steps(step) == "behind"
            aligned = summary is not None and summary.steps(step) == "aligned"
            agreed = summary.epoch_agreed if summary is not None else 0
            commands = summary.commands_agreed if summary is not None else 0
            ok, agreed, behind, commands = self._vote(aligned, agreed, behind, commands)
            if behind:
                raise LeftQuorum(f"replica {self.replica} is behind the others at step {step}")
            if ok:
                break
            retries += 1
            self._await_next_epoch()
        self.inbox.agree(commands)
        assert summary is not None  # the vote passed: this rank's exchange succeeded
        return self._commit(flat, chunk, buffer[: kept.numel()], summary, agreed, retries)

    def _control(self, contributing: bool, batch: int, step: int) -> torch.Tensor:
        control = torch.zeros(_FIELDS, self.num_replicas)
        slot = ControlSlot(
            contributed=contributing,
            batch=batch,
            epoch_seen=self._epoch(),
            step=step,
            present=True,
            commands_seen=self.inbox.seen(),
        )
        control[:, self.replica] = torch.tensor(slot.values())
        return control.reshape(-1)

    def _commit(
        self,
        flat: torch.Tensor,
        chunk: torch.Tensor,
        summed: torch.Tensor,
        summary: ExchangeSummary,
        agreed: int,
        retries: int,
    ) -> ExchangeResult:
        contributors = summary.contributors
        chunk.copy_(summed / max(1, contributors))
        if self.intra is not None:
            # the slices differ by one element when the size does not divide: gloo
            # gathers equal sizes, so each is padded to the largest
            parts = list(flat.tensor_split(self.replica_size))
            size = parts[0].numel()
            padded = flat.new_zeros(size)
            padded[: chunk.numel()] = chunk
            gathered = [flat.new_empty(size) for _ in parts]
            self.intra.allgather([gathered], [padded]).wait()
            for part, got in zip(parts, gathered, strict=True):
                part.copy_(got[: part.numel()])
        self.ledger.mark_trained(summary.trained())
        if agreed > self.membership.epoch:
            self._pending = self._read(agreed)
        if self._zero_next and self._catching_up is not None:
            self._catching_up.done()
        self._zero_next = False
        members = summary.members
        scale = math.sqrt(contributors / self.num_replicas) if self.lr_scaling else 1.0
        trained = tuple(summary.trained())
        return ExchangeResult(self.membership.epoch, members, contributors, retries, scale, trained)

    def after_step(self, step: int, update: torch.Tensor, lr: float) -> None:
        """Call after the optimizer step with the averaged gradient and the lr it applied:
        serves catch-up requests, and tells an admitted joiner where it starts."""
        self.source.after_step(step, update, lr)
        pending = self._pending
        if pending is not None and pending.joining and self.replica == pending.source:
            self._announce_start(pending, step + 1)

    def _announce_start(self, membership: Membership, start: int) -> None:
        if self._published != membership.epoch:
            self._published = membership.epoch
            self.store.set(key_start(membership.epoch), encode(EpochStart(start)))

    # ---- membership ---------------------------------------------------------------------------
    def _epoch(self) -> int:
        """The newest epoch published; never one older than seen (a value put back)."""
        epoch = decode(EpochPointer, self.store.get(KEY_EPOCH)).epoch
        self._epoch_high = max(self._epoch_high, epoch)
        return self._epoch_high

    def _latest(self) -> Membership:
        return self._read(self._epoch())

    def _read(self, epoch: int) -> Membership:
        return decode_membership(epoch, self.store.get(key_members(epoch)))

    def _switch(self, membership: Membership) -> None:
        self._pending = None
        if self.replica not in membership.members:
            raise LeftQuorum(f"replica {self.replica} is not in epoch {membership.epoch}")
        dropped = self._dropped_before(membership.epoch)
        if dropped is not None:
            raise LeftQuorum(
                f"replica {self.replica} (incarnation {self.incarnation}) was out of the quorum "
                f"in epoch {dropped}: the replica {self.replica} of epoch {membership.epoch} is "
                "a later incarnation, and this rank ends without exchanging"
            )
        self.membership = membership

    def _dropped_before(self, epoch: int) -> int | None:
        """The first epoch after this rank's and before ``epoch`` that its replica was not
        a member of, if any. A rank cut off from the store (its host's link down) can see
        the epochs again only after its replica was dropped and a later incarnation
        admitted in its place: it must not take that incarnation's place in the exchange.
        An epoch whose membership the store no longer holds is no evidence."""
        for between in range(self.membership.epoch + 1, epoch):
            if not self.store.check([key_members(between)]):
                continue
            if self.replica not in self._read(between).members:
                return between
        return None

    def _await_next_epoch(self, timeout_s: float = 300.0) -> None:
        current = self.membership.epoch
        deadline = time.monotonic() + timeout_s
        latest = self._epoch()
        while latest <= current:
            if time.monotonic() > deadline:
                raise LeftQuorum(f"no epoch after {current} within {timeout_s:.0f} s")
            time.sleep(0.005)
            latest = self._epoch()
        if self.intra is not None:  # every rank of the replica moves to the same epoch
            agreed = torch.tensor([float(latest)])
            self.intra.allreduce([agreed], _op(dist.ReduceOp.MAX)).wait()
            latest = int(agreed.item())
        membership = self._read(latest)
        self._switch(membership)
        if membership.joining and self.replica == membership.source:
            step = decode(Heartbeat, self.store.get(key_heartbeat(self.rank))).step
            self._announce_start(membership, step)

    def _vote(
        self, ok: bool, agreed: int, behind: bool, commands: int
    ) -> tuple[bool, int, bool, int]:
        """Phase one of the commit: every rank of the replica says whether it succeeded."""
        if self.intra is None:
            return ok, agreed, behind, commands
        ballot = torch.tensor([float(ok), -float(agreed), -float(behind), -float(commands)])
        self.intra.allreduce([ballot], _op(dist.ReduceOp.MIN)).wait()
        return bool(ballot[0] > 0), int(-ballot[1]), bool(ballot[2] < 0), int(-ballot[3])

    # ---- control commands ------------------------------------------------------------------
    def commands(self) -> list[Command]:
        """Commands every member agreed on in the last exchange and this rank has not run:
        run them after this step's optimizer step, in order, then ``answer`` each."""
        return self.inbox.take()

    def answer(self, command: Command, answer: Answer) -> None:
        """Rank 0 of the replica tells the supervisor what the command did here."""
        self.inbox.answer(command.number, answer)

    def barrier(self) -> None:
        """Waits for every rank of this replica (checkpoint manifests need it)."""
        if self.intra is not None:
            self.intra.allreduce([torch.zeros(1)]).wait()

    def _cross_allreduce(self, buffer: torch.Tensor) -> bool:
        """Sums ``buffer`` over the epoch's members; False if the exchange failed."""
        membership = self.membership
        if len(membership.members) == 1:
            return True
        group = self._group(membership)
        if group is None:
            return False
        work = group.allreduce([buffer])
        deadline = time.monotonic() + self.cross_timeout_s
        next_check = 0.0
        while not work.is_completed():
            now = time.monotonic()
            if now > next_check:
                if self.store.check([key_broken(membership.epoch)]) or now > deadline:
                    self._abandon()
                    return False
                next_check = now + 0.005
            time.sleep(0.0002)
        try:
            work.wait()
        except RuntimeError:  # a peer died: "connection reset", or gloo's own timeout
            self._abandon()
            return False
        return True

    def _group(self, membership: Membership) -> dist.Group | None:
        if self._cross is not None and self._cross_epoch == membership.epoch:
            return self._cross
        self._abandon()
        prefix = prefix_cross(membership.epoch, self.replica_rank)
        index = membership.members.index(self.replica)
        built: dict[str, Any] = {}

        def build() -> None:
            try:
                built["pg"] = dist.gloo_group(
                    dist.PrefixStore(prefix, self._client()),
                    index,
                    len(membership.members),
                    self.cross_timeout_s,
                )
            except RuntimeError as exc:
                built["error"] = exc

        # Built on a thread so that a member dying during set-up aborts it at once.
        thread = threading.Thread(target=build, daemon=True, name="cross-group")
        thread.start()
        while thread.is_alive():
            thread.join(0.005)
            if thread.is_alive() and self.store.check([key_broken(membership.epoch)]):
                return None
        if "pg" not in built:
            return None
        self._cross, self._cross_epoch = built["pg"], membership.epoch
        return self._cross

    def _abandon(self) -> None:
        # A group with a failed collective may still have threads waiting in it: keep it
        # referenced so that it is never destroyed under them.
        if self._cross is not None:
            self._abandoned.append(self._cross)
        self._cross, self._cross_epoch = None, -1

    def _client(self) -> SealedStore:
        host, _, port = self.store_address.rpartition(":")
        raw = dist.TCPStore(
            host, int(port), is_master=False, timeout=timedelta(seconds=self.cross_timeout_s)
        )
        client = SealedStore(raw, self.store.secret)
        self._clients.append(client)
        return client

    def close(self) -> None:
        self.server.close()


def _summary(control: torch.Tensor, replicas: int) -> ExchangeSummary | None:
    """The summed control vector read by name; None (the exchange failed) when a peer
    sent values that are not whole counts."""
    rows = control.view(_FIELDS, replicas).tolist()
    try:
        return ExchangeSummary.from_rows(rows)
    except ProtocolError:
        return None


def _op(op: dist.ReduceOp.RedOpType) -> dist.AllreduceOptions:
    options = dist.AllreduceOptions()
    options.reduceOp = op  # type: ignore[assignment]  # the stub's enum is the nested type
    return options
