"""The torch.distributed pieces the runtime builds groups from, typed.

``torch.distributed`` re-exports them without declaring it, which strict mypy rejects;
they are imported here once from the extension that defines them.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Protocol, cast

from torch import Tensor
from torch._C._distributed_c10d import (
    AllreduceOptions,
    PrefixStore,
    ProcessGroup,
    ProcessGroupGloo,
    ReduceOp,
    Store,
    TCPStore,
    Work,
)


class Group(Protocol):
    """The collectives the runtime calls on a group (the stubs type gloo as a backend)."""

    def allreduce(self, tensors: list[Tensor], opts: Any = ...) -> Work: ...

    def allgather(self, outputs: list[list[Tensor]], inputs: list[Tensor]) -> Work: ...


__all__ = [
    "AllreduceOptions",
    "Group",
    "PrefixStore",
    "ProcessGroup",
    "ProcessGroupGloo",
    "ReduceOp",
    "Store",
    "TCPStore",
    "Work",
    "gloo_group",
]


def gloo_group(store: Store, rank: int, size: int, timeout_s: float) -> Group:
    """A standalone gloo group over ``store`` (no ``init_process_group``: no global state)."""
    return cast(Group, ProcessGroupGloo(store, rank, size, timedelta(seconds=timeout_s)))
