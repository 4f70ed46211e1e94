"""``DistributedDataParallel`` inside a replica.

Under replica recovery a rank's ``torch.distributed`` world is its replica: DDP averages
the gradient among the replica's ranks as usual, and the manager exchanges it across the
replicas (``OptimizerWrapper.step``). ``init_process_group`` replaces the script's call of
the same name: it makes the default group of this replica's ranks (rank = the rank within
the replica), meeting through the quorum's sealed store under a prefix of its own per
incarnation, so a relaunched replica never meets a stale group.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import torch.distributed

from ft_runtime import _dist as dist
from ft_runtime.layout import ENV_ATTEMPT, ENV_REPLICA, ENV_REPLICA_RANK, ENV_REPLICA_SIZE
from ft_runtime.quorum import ENV_QUORUM
from ft_runtime.replica.auth import JobSecret
from ft_runtime.replica.protocol import prefix_user
from ft_runtime.replica.store import SealedStore, connect

__all__ = ["init_process_group"]

_KEEP: list[SealedStore] = []  # the group calls back into its store: kept alive


def init_process_group(backend: str = "gloo", timeout_s: float = 300.0, **kwargs: Any) -> None:
    """``torch.distributed.init_process_group`` for this replica's ranks only.

    Outside replica recovery (no quorum in the environment) it is the ordinary call, so a
    converted script still runs under plain ``torchrun``.
    """
    address = os.environ.get(ENV_QUORUM, "")
    if not address:
        torch.distributed.init_process_group(backend, **kwargs)
        return
    store = connect(address, JobSecret.from_env(), timeout_s=timeout_s)
    _KEEP.append(store)
    replica = int(os.environ.get(ENV_REPLICA, 0))
    incarnation = int(os.environ.get(ENV_ATTEMPT, 0))
    prefixed = dist.PrefixStore(prefix_user(replica, incarnation), store)
    torch.distributed.init_process_group(
        backend,
        store=prefixed,
        rank=int(os.environ.get(ENV_REPLICA_RANK, 0)),
        world_size=int(os.environ.get(ENV_REPLICA_SIZE, 1)),
        timeout=timedelta(seconds=timeout_s),
        **kwargs,
    )
