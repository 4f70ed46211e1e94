"""Small builders of step batches for the detector tests."""

from __future__ import annotations

from collections.abc import Mapping

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
