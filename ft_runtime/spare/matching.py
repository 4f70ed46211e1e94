"""Bipartite graphs of shard types against stack slots, and the library algorithms on them.

Hopcroft–Karp is scipy's ``maximum_bipartite_matching``; min-cost max-flow is networkx's
``max_flow_min_cost``. Nothing here implements a graph algorithm of its own.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import numpy as np

try:
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import maximum_bipartite_matching
except ImportError as exc:  # scipy is in the planner extra, not in a training node's deps
    raise ImportError(
        "SPARe's controller needs scipy and networkx: pip install 'eagleeye[planner]'"
    ) from exc

Slot = tuple[int, int]  # (group, layer): layer 0 is the top of the group's stack


def slots(survivors: Sequence[int], stack: int) -> list[Slot]:
    """The top-``stack`` slots of every surviving group, group-major."""
    return [(g, layer) for g in survivors for layer in range(stack)]


def hopcroft_karp(
    n_shards: int, cols: Sequence[Slot], allowed: Mapping[Slot, Collection[int]]
) -> dict[int, Slot] | None:
    """A perfect matching of every shard type to one slot, or None if none exists.

    Args:
        n_shards: number of shard types (rows).
        cols: the slots (columns).
        allowed: for each slot, the shard types it may compute.

    Returns:
        shard type -> slot for all types, or None when some type stays unmatched.
    """
    rows: list[int] = []
    idx: list[int] = []
    for j, slot in enumerate(cols):
        for t in allowed[slot]:
            rows.append(t)
            idx.append(j)
    if not rows:
        return None
    graph = csr_matrix(
        (np.ones(len(rows), dtype=np.int8), (rows, idx)), shape=(n_shards, len(cols))
    )
    match = maximum_bipartite_matching(graph, perm_type="column")
    if (match < 0).any():
        return None
    return {t: cols[int(j)] for t, j in enumerate(match)}


def min_cost_assignment(
    n_shards: int,
    cols: Sequence[Slot],
    holds: Mapping[int, Collection[int]],
    order: Mapping[int, Sequence[int]],
) -> tuple[dict[int, Slot], int]:
    """Min-cost max-flow from shard types to slots: the assignment that moves least.

    A shard type costs 0 in the slot that already holds it and 1 in any other slot of a
    group that holds it; the flow is the number of types, so every type gets one slot.

    Args:
        n_shards: number of shard types.
        cols: candidate slots (group, layer).
        holds: group -> the shard types in its stack (any may be moved to any slot).
        order: group -> its current stack order, top first.

    Returns:
        (shard type -> slot, total cost = slots that change type).
    """
    import networkx as nx

    graph = nx.DiGraph()
    for t in range(n_shards):
        graph.add_edge("src", ("t", t), capacity=1, weight=0)
    for g, layer in cols:
        graph.add_edge(("s", g, layer), "sink", capacity=1, weight=0)
        for t in holds[g]:
            cost = 0 if order[g][layer] == t else 1
            graph.add_edge(("t", t), ("s", g, layer), capacity=1, weight=cost)
    flow = nx.max_flow_min_cost(graph, "src", "sink")
    chosen: dict[int, Slot] = {}
    for t in range(n_shards):
        for node, f in flow[("t", t)].items():
            if f > 0:
                chosen[t] = (node[1], node[2])
    cost = int(nx.cost_of_flow(graph, flow))
    return chosen, cost
