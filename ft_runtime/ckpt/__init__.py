"""The checkpoint engine: in-memory snapshots held by a per-node process, DP-sharded,
backed up to the next node, persisted in the background, restored memory-first.

See docs/checkpointing.md for the design and the failure coverage.
"""

from __future__ import annotations

from ft_runtime.ckpt._manifest import CorruptCheckpoint
from ft_runtime.ckpt._rpc import HolderUnavailable
from ft_runtime.ckpt.action import CheckpointRuntime, StateWatcher
from ft_runtime.ckpt.client import CheckpointClient
from ft_runtime.ckpt.config import (
    ENV_CKPT_TOKEN,
    ENV_SHM_DIR,
    ClientConfig,
    HolderConfig,
    Ring,
    shm_dir_from,
)
from ft_runtime.ckpt.holder import Holder
from ft_runtime.ckpt.launch import HolderProcess, holder_argv
from ft_runtime.ckpt.types import CkptState, LoadResult, SaveResult, StateChange, Tier

__all__ = [
    "ENV_CKPT_TOKEN",
    "ENV_SHM_DIR",
    "CheckpointClient",
    "CheckpointRuntime",
    "CkptState",
    "ClientConfig",
    "CorruptCheckpoint",
    "Holder",
    "HolderConfig",
    "HolderProcess",
    "HolderUnavailable",
    "LoadResult",
    "Ring",
    "SaveResult",
    "StateChange",
    "StateWatcher",
    "Tier",
    "holder_argv",
    "shm_dir_from",
]
