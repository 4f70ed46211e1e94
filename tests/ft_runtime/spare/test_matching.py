from __future__ import annotations

import networkx as nx
import numpy as np
import pytest

from ft_runtime.spare.matching import hopcroft_karp, min_cost_matching


def _random_graph(seed: int) -> tuple[int, int, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    n_rows, n_cols = 12, 20
    rows = np.concatenate([np.arange(n_rows), rng.integers(0, n_rows, 50)])
    cols = np.concatenate([rng.permutation(n_cols)[:n_rows], rng.integers(0, n_cols, 50)])
    pairs = sorted(set(zip(rows.tolist(), cols.tolist(), strict=True)))
    r, c = (np.array(v) for v in zip(*pairs, strict=True))
    return n_rows, n_cols, r, c, rng.integers(0, 3, len(r))


@pytest.mark.parametrize("seed", range(8))
def test_min_cost_matching_equals_networkx_min_cost_max_flow(seed: int) -> None:
    n_rows, n_cols, rows, cols, cost = _random_graph(seed)
    match, total = min_cost_matching(n_rows, n_cols, rows, cols, cost)
    edge_cost = {(int(a), int(b)): int(w) for a, b, w in zip(rows, cols, cost, strict=True)}
    assert len(set(match.tolist())) == n_rows  # one column per row
    assert sum(edge_cost[(t, int(j))] for t, j in enumerate(match)) == total
    g = nx.DiGraph()
    for t in range(n_rows):
        g.add_edge("s", ("r", t), capacity=1, weight=0)
    for j in range(n_cols):
        g.add_edge(("c", j), "k", capacity=1, weight=0)
    for (a, b), w in edge_cost.items():
        g.add_edge(("r", a), ("c", b), capacity=1, weight=w)
    flow = nx.max_flow_min_cost(g, "s", "k")
    assert nx.cost_of_flow(g, flow) == total


def test_hopcroft_karp_reports_an_uncoverable_row() -> None:
    rows, cols = np.array([0, 1, 2]), np.array([0, 0, 1])  # rows 0 and 1 share one column
    assert hopcroft_karp(3, 2, rows, cols) is None
    match = hopcroft_karp(2, 2, np.array([0, 0, 1]), np.array([0, 1, 0]))
    assert match is not None
    assert sorted(match.tolist()) == [0, 1]
