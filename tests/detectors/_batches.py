"""Small builders of step batches for the detector tests."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np

from detectors.stepbatch import StepBatch


def batch(
    step: int, columns: Mapping[str, np.ndarray], ranks_per_node: int = 4, time: float | None = None
) -> StepBatch:
    """One step of ``len(column)`` ranks, nodes of ``ranks_per_node`` ranks."""
    names = tuple(columns)
    values = np.stack([np.asarray(columns[n], dtype=float) for n in names], axis=1)
    n = values.shape[0]
    ranks = np.arange(n)
    nodes = np.array([f"n{r // ranks_per_node}" for r in ranks], dtype=object)
    return StepBatch(
        step,
        float(step) if time is None else time,
        ranks,
        nodes,
        np.zeros(n, dtype=int),
        names,
        values,
    )


def noisy(rng: np.random.Generator, n: int, level: float = 100.0, sd: float = 0.01) -> np.ndarray:
    return level * (1.0 + sd * rng.standard_normal(n))


def wandering_memory(seed: int, leak: float = 0.0, reports: int = 600) -> Iterator[StepBatch]:
    """GB used by one host's 8 ranks, each wandering about its own footprint (a caching
    allocator's memory: pulled back 5 % a report, moved 0.03 GB), a report every 5 s;
    rank 3 leaks ``leak`` GB a second from report 100."""
    rng = np.random.default_rng(seed)
    footprint = 66.0 + rng.uniform(-0.4, 0.4, 8)
    x = footprint.copy()
    for s in range(reports):
        x = x + 0.05 * (footprint - x) + 0.03 * rng.standard_normal(8)
        y = x.copy()
        y[3] += leak * 5.0 * max(0, s - 100)
        yield batch(s, {"mem_used": y}, ranks_per_node=8, time=5.0 * s)
