"""The checkpoint engine: in-memory snapshots held by a per-node process, DP-sharded,
backed up to the next node, persisted in the background, restored memory-first.

See docs/checkpointing.md for the design and the failure coverage.

Names are imported on first use: a process that only starts holders or reads their
configuration (``eagleeye run``) does not import torch for it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
        parse_ring,
        ring_text,
        shm_dir_from,
    )
    from ft_runtime.ckpt.holder import Holder
    from ft_runtime.ckpt.launch import HolderProcess, holder_argv
    from ft_runtime.ckpt.types import CkptState, LoadResult, SaveResult, StateChange, Tier

_WHERE = {
    "CorruptCheckpoint": "_manifest",
    "HolderUnavailable": "_rpc",
    "CheckpointRuntime": "action",
    "StateWatcher": "action",
    "CheckpointClient": "client",
    "ENV_CKPT_TOKEN": "config",
    "ENV_SHM_DIR": "config",
    "ClientConfig": "config",
    "HolderConfig": "config",
    "Ring": "config",
    "shm_dir_from": "config",
    "parse_ring": "config",
    "ring_text": "config",
    "Holder": "holder",
    "HolderProcess": "launch",
    "holder_argv": "launch",
    "CkptState": "types",
    "LoadResult": "types",
    "SaveResult": "types",
    "StateChange": "types",
    "Tier": "types",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'ft_runtime.ckpt' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"ft_runtime.ckpt.{module}"), name)
    globals()[name] = value
    return value


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
    "parse_ring",
    "ring_text",
    "shm_dir_from",
]
