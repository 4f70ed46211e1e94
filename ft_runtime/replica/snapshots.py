"""A replica's checkpoints through the job's snapshot holders (``eagleeye run --snapshots``).

Under replica recovery one replica saves for all: the epoch's source (healthy replicas hold
bitwise the same state). With holders, each rank of that replica copies its
``1/replica_size`` share of every tensor into its node's holder (the save blocks only for
that copy); the holder backs the snapshot up to the next node and persists it. A job
restarted as a whole then restores every rank from the fastest tier that has the newest
complete snapshot: its node's memory, a peer node's holder, then storage.

The ranks of a replica must hold the same state (data parallel inside the replica, as with
``DistributedDataParallel``): a restore reassembles the whole from the replica's shares.

Example::

    snapshots = Snapshots.from_env(manager)  # None without holders
    if snapshots is not None and manager.is_saving_replica():
        snapshots.save({**state_dict(), "manager": manager.state_dict()}, step)
    restored = snapshots.load()  # on a job restart: Restored(step, state, tier, seconds)
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ft_runtime.ckpt.config import ENV_CKPT_TOKEN, ClientConfig, parse_ring
from ft_runtime.layout import ENV_NODE, ENV_SNAPSHOT_RING, ENV_SNAPSHOT_STORAGE

if TYPE_CHECKING:
    from ft_runtime.ckpt import CheckpointClient, SaveResult

__all__ = ["Restored", "Snapshots"]


class _Placed(Protocol):
    """Where a rank sits in its replica (a ``Manager`` is one)."""

    @property
    def replica_rank(self) -> int: ...

    @property
    def replica_size(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Restored:
    """A restored snapshot: its step, the state, the slowest tier a share came from
    (``memory``, ``peer`` or ``storage``) and how long the restore took."""

    step: int
    state: dict[str, Any]
    tier: str
    seconds: float


class Snapshots:
    """One rank's saves into its node's holder and restores from the fastest tier."""

    def __init__(self, client: CheckpointClient) -> None:
        self.client = client

    @classmethod
    def from_env(cls, placed: _Placed, env: Mapping[str, str] | None = None) -> Snapshots | None:
        """The rank's snapshots from the environment ``eagleeye run --snapshots`` sets; None
        when the job has no holders (the script keeps its own checkpoints then)."""
        env = os.environ if env is None else env
        text = env.get(ENV_SNAPSHOT_RING, "")
        if not text:
            return None
        cfg = ClientConfig(
            env.get(ENV_NODE, "node0"),
            parse_ring(text),
            dp_rank=placed.replica_rank,
            dp_size=placed.replica_size,
            storage=env.get(ENV_SNAPSHOT_STORAGE) or None,
            token=env.get(ENV_CKPT_TOKEN, ""),
        )
        from ft_runtime.ckpt.client import CheckpointClient  # torch: only in ranks

        return cls(CheckpointClient(cfg))

    def save(self, state: Mapping[str, Any], step: int) -> SaveResult:
        """Copies this rank's share of ``state`` into the holder as ``step``. Call it on
        every rank of the saving replica at the same step. A holder that is gone or full
        gives ``ok=False`` (the previous snapshot is kept), never an exception."""
        return self.client.save(dict(state), step)

    def load(self, at_most: int | None = None) -> Restored | None:
        """The newest complete snapshot (no later than ``at_most``), memory first; None
        when there is none anywhere."""
        began = time.perf_counter()
        got = self.client.load(at_most=at_most)
        if got is None:
            return None
        return Restored(got.step, dict(got.state), got.tier.value, time.perf_counter() - began)

    def close(self) -> None:
        self.client.close()
