"""The exactly-once data ledger, as a sampler for the user's ``DataLoader``.

Each replica reads its own stream of batches; batch ``b`` of replica ``r`` is a fixed set
of samples (a seeded permutation per pass over the data, cut into one shard per replica,
each shard into batches of ``batch_size`` samples per rank of the replica). The manager
records in the quorum's store which batches every replica committed, so a replica that
restarts, catches up or rolls back resumes at its first batch not yet trained: no batch is
trained twice or skipped, whatever fails.

Use it as ``DataLoader(dataset, batch_size=B, sampler=ReplicaSampler(dataset, manager, B))``
with ``num_workers=0`` (the sampler asks the manager for the next batch as the loader
fetches it; workers would fetch ahead).
"""

from __future__ import annotations

from collections.abc import Iterator, Sized

import torch

from ft_runtime.replica.manager import Manager

__all__ = ["ReplicaSampler"]


class ReplicaSampler(torch.utils.data.Sampler[int]):
    """Indices of this rank's share of its replica's next untrained batch, batch by batch.

    Args:
        dataset: anything with a length.
        manager: the rank's replica manager (its ledger says which batch is next).
        batch_size: samples per rank per step (the ``DataLoader``'s ``batch_size``).
        seed: the permutation's seed (the same on every rank).
        shuffle: permute each pass over the data.
    """

    def __init__(
        self,
        dataset: Sized,
        manager: Manager,
        batch_size: int,
        seed: int = 0,
        shuffle: bool = True,
    ) -> None:
        self.size = len(dataset)
        self.manager = manager
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        per_replica = self.size // manager.num_replicas
        self.per_pass = per_replica // (batch_size * manager.replica_size)
        if self.per_pass < 1:
            raise ValueError(
                f"{self.size} samples make no batch of {batch_size} per rank for "
                f"{manager.num_replicas} replicas of {manager.replica_size} ranks"
            )

    def set_epoch(self, epoch: int) -> None:
        """Accepted for ``DistributedSampler`` compatibility: the ledger knows the pass."""

    def __len__(self) -> int:
        return self.per_pass * self.batch_size

    def indices(self, batch: int) -> list[int]:
        """This rank's samples of its replica's batch ``batch``."""
        passes, within = divmod(batch, self.per_pass)
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed + passes)
            order = torch.randperm(self.size, generator=generator).tolist()
        else:
            order = list(range(self.size))
        shard = order[self.manager.replica :: self.manager.num_replicas]
        step = self.batch_size * self.manager.replica_size
        start = within * step + self.manager.replica_rank * self.batch_size
        return shard[start : start + self.batch_size]

    def __iter__(self) -> Iterator[int]:
        """Yields batch after batch, each the manager's next untrained one, until the end
        of the current pass over the data."""
        self.manager.begin_step()
        while True:
            batch = self.manager.batch
            yield from self.indices(batch)
            if (batch + 1) % self.per_pass == 0:
                return
