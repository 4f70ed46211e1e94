"""The exactly-once data ledger in the quorum's store: which batches each replica consumed.

``data/<r>/<b>`` marks batch b of replica r consumed, trained or skipped. Rank 0 of every
member marks the batches of every contributor after each committed exchange, so a mark
survives any one replica; a replica resumes at its first unmarked batch. After a restore
from a checkpoint the batches from the checkpoint's position on are forgotten: they were
trained into a state that is gone.
"""

from __future__ import annotations

from collections.abc import Iterable

from ft_runtime import _dist as dist
from ft_runtime.replica.protocol import (
    SKIPPED,
    TRAINED,
    LedgerMark,
    encode,
    key_ledger,
)

__all__ = ["Ledger"]


class Ledger:
    """One rank's view of the ledger; only rank 0 of a replica writes.

    Args:
        store: the sealed client of the quorum's store.
        replica: this rank's replica.
        writer: whether this rank writes (rank 0 of its replica).
    """

    def __init__(self, store: dist.Store, replica: int, writer: bool) -> None:
        self.store, self.replica, self.writer = store, replica, writer

    def next_batch(self, start: int = 0, replica: int | None = None) -> int:
        """A replica's (this one's by default) first batch not yet consumed, looking from
        ``start``."""
        replica = self.replica if replica is None else replica
        batch = start
        while self.store.check([key_ledger(replica, batch)]):
            batch += 1
        return batch

    def mark_trained(self, trained: Iterable[tuple[int, int]]) -> None:
        """Marks ``(replica, batch)`` pairs trained (one committed exchange's)."""
        if self.writer:
            for replica, batch in trained:
                self.store.set(key_ledger(replica, batch), encode(LedgerMark(TRAINED)))

    def skip(self, batch: int) -> None:
        """Marks this replica's ``batch`` consumed untrained."""
        if self.writer:
            self.store.set(key_ledger(self.replica, batch), encode(LedgerMark(SKIPPED)))

    def unmark(self, batch: int) -> None:
        """Unmarks this replica's ``batch`` (a mark another replica wrote late, after this
        one forgot it on a restore)."""
        if self.writer:
            self.store.delete_key(key_ledger(self.replica, batch))

    def forget_from(self, start: int) -> None:
        """Unmarks this replica's batches from ``start`` on (after a restore)."""
        if not self.writer:
            return
        batch = start
        while self.store.check([key_ledger(self.replica, batch)]):
            self.store.delete_key(key_ledger(self.replica, batch))
            batch += 1
