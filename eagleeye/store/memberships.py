"""The quorum coordinator's memory in the run store, so that a restarted one resumes.

``ft_runtime`` does not know the run store; it takes any ``MembershipLog``. This one writes
each membership to the ``memberships`` table and waits for the commit before the
coordinator publishes it, and reads the newest one back for a coordinator that starts on
a run that already has one.
"""

from __future__ import annotations

from eagleeye.store.writer import RunStore
from ft_runtime.membership import Membership, QuorumRecord


class StoreMembershipLog:
    """A ``ft_runtime.quorum.MembershipLog`` over a run's store."""

    def __init__(self, store: RunStore, fresh: bool = False) -> None:
        """``fresh``: a resumed run's log, whose coordinator starts a new quorum (the store
        process that earlier records name ended with their controller): ``last()`` is None
        until this log has recorded a membership of its own."""
        self.store = store
        self._fresh = fresh

    def record(self, record: QuorumRecord, time: float) -> None:
        m = record.membership
        self.store.add_membership(
            time, m.epoch, m.members, m.joining, record.expected, record.store_address
        )
        self.store.flush()
        self._fresh = False

    def last(self) -> QuorumRecord | None:
        if self._fresh:
            return None
        row = self.store.last_membership()
        if row is None:
            return None
        membership = Membership(row["epoch"], tuple(row["members"]), tuple(row["joining"]))
        return QuorumRecord(membership, row["store_address"], row["expected"])
