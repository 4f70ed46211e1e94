"""Bipartite graphs of shard types against stack slots, and the library algorithms on them.

Rows are shard types, columns are stack slots; an edge (t, j) says slot j may compute type
t. Hopcroft–Karp is scipy's ``maximum_bipartite_matching``; the least-movement reordering
is scipy's ``min_weight_full_bipartite_matching`` (LAPJVsp), which is min-cost max-flow on
this unit-capacity graph (tests check it against networkx's ``max_flow_min_cost``).
Nothing here implements a graph algorithm of its own.
"""

from __future__ import annotations

import numpy as np

try:
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import (
        maximum_bipartite_matching,
        min_weight_full_bipartite_matching,
    )
except ImportError as exc:  # scipy is in the planner extra, not in a training node's deps
    raise ImportError(
        "SPARe's controller needs scipy and networkx: pip install 'eagleeye[planner]'"
    ) from exc


def _graph(
    n_rows: int, n_cols: int, rows: np.ndarray, cols: np.ndarray, data: np.ndarray
) -> csr_matrix:
    return csr_matrix((data, (rows, cols)), shape=(n_rows, n_cols))


def hopcroft_karp(
    n_rows: int, n_cols: int, rows: np.ndarray, cols: np.ndarray
) -> np.ndarray | None:
    """A matching that covers every row, or None if none exists.

    Returns:
        For each row, the index of its matched column.
    """
    if len(rows) == 0:
        return None
    graph = _graph(n_rows, n_cols, rows, cols, np.ones(len(rows), dtype=np.int8))
    match = maximum_bipartite_matching(graph, perm_type="column")
    return None if (match < 0).any() else np.asarray(match)


def min_cost_matching(
    n_rows: int, n_cols: int, rows: np.ndarray, cols: np.ndarray, cost: np.ndarray
) -> tuple[np.ndarray, int]:
    """The row-covering matching of least total cost (costs are non-negative integers).

    Returns:
        (column matched to each row, total cost).

    Raises:
        ValueError: no matching covers every row (check with ``hopcroft_karp`` first).
    """
    # A sparse matrix cannot hold a zero-weight edge: shift every cost by one. Every row is
    # matched exactly once, so the shift adds n_rows to any full matching and the argmin
    # does not move.
    graph = _graph(n_rows, n_cols, rows, cols, cost.astype(np.float64) + 1.0)
    r, c = min_weight_full_bipartite_matching(graph)
    match = np.empty(n_rows, dtype=np.int64)
    match[r] = c
    total = float(np.asarray(graph[r, c]).sum()) - n_rows
    return match, int(round(total))
