"""Stable per-rank state across steps for the vectorised detectors."""

from __future__ import annotations

import numpy as np


class RankLayout:
    """Maps each step's rank rows onto fixed state slots.

    At scale every step lists the same ranks in the same order, so the common case is an
    array comparison; a changed layout (a rank joined or left) costs one dictionary pass.
    """

    def __init__(self) -> None:
        self.ranks = np.empty(0, dtype=np.int64)
        self.nodes = np.empty(0, dtype=object)
        self.node_ids = np.empty(0, dtype=np.int64)
        self.node_names: np.ndarray = np.empty(0, dtype=object)
        self.node_sizes = np.empty(0, dtype=np.int64)
        self.replicas = np.empty(0, dtype=np.int64)
        self.replica_sizes = np.empty(0, dtype=np.int64)
        self.replica_nodes = np.empty(0, dtype=np.int64)  # distinct nodes per replica
        self._slot: dict[int, int] = {}

    def rows_to_slots(
        self, ranks: np.ndarray, nodes: np.ndarray, replicas: np.ndarray | None = None
    ) -> np.ndarray | None:
        """Returns the slot of each row, or None when rows equal slots (the fast path).

        New ranks get new slots; callers grow their state arrays to ``len(self.ranks)``.
        """
        if len(ranks) == len(self.ranks) and np.array_equal(ranks, self.ranks):
            return None
        slots = np.empty(len(ranks), dtype=np.int64)
        added = False
        for i, rank in enumerate(ranks.tolist()):
            slot = self._slot.get(rank)
            if slot is None:
                slot = self._slot[rank] = len(self._slot)
                added = True
            slots[i] = slot
        if added:
            self._grow(ranks, nodes, slots)
            self._group_replicas(replicas, slots)
        if len(ranks) == len(self.ranks) and np.array_equal(slots, np.arange(len(ranks))):
            return None
        return slots

    def _grow(self, ranks: np.ndarray, nodes: np.ndarray, slots: np.ndarray) -> None:
        size = len(self._slot)
        new_ranks = np.full(size, -1, dtype=np.int64)
        new_nodes = np.full(size, "", dtype=object)
        new_ranks[: len(self.ranks)] = self.ranks
        new_nodes[: len(self.nodes)] = self.nodes
        new_ranks[slots] = ranks
        new_nodes[slots] = nodes
        self.ranks, self.nodes = new_ranks, new_nodes
        self.node_names, self.node_ids = np.unique(self.nodes.astype(str), return_inverse=True)
        self.node_sizes = np.bincount(self.node_ids, minlength=len(self.node_names))

    def _group_replicas(self, replicas: np.ndarray | None, slots: np.ndarray) -> None:
        new = np.zeros(len(self.ranks), dtype=np.int64)
        new[: len(self.replicas)] = self.replicas
        if replicas is not None:
            new[slots] = replicas
        self.replicas = new
        self.replica_sizes = np.bincount(new)
        pairs = np.unique(np.stack([new, self.node_ids]), axis=1)
        self.replica_nodes = np.bincount(pairs[0], minlength=len(self.replica_sizes))


def to_slots(column: np.ndarray, slots: np.ndarray | None, size: int) -> np.ndarray:
    """Scatters one step's rows into slot order; slots that did not report get NaN."""
    if slots is None:
        return column
    out = np.full((size, *column.shape[1:]), np.nan, dtype=column.dtype)
    out[slots] = column
    return out
