"""The detectors' edge: frames and steps in canonical metric names and units.

Telemetry may name a metric as dcgm-exporter, NVML or the hook does, or in another unit
(``DCGM_FI_DEV_FB_USED`` in MiB for ``mem_used`` in GB); collector.vocabulary knows them
all. Every detector reads canonical names only, so the pipeline converts once, here.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

import numpy as np

from collector.types import Frame
from collector.vocabulary import canonical_name, canonical_values, scale_of
from detectors.stepbatch import StepBatch

_Plan = tuple[tuple[str, ...], tuple[tuple[int, ...], ...], tuple[float, ...]]


@lru_cache(maxsize=256)
def _plan(features: tuple[str, ...]) -> _Plan | None:
    """For a feature tuple: the canonical names, the source columns of each (the canonical
    column first) and each column's factor; None when the names are canonical already."""
    names = tuple(canonical_name(f) for f in features)
    if names == features:
        return None
    order = list(dict.fromkeys(names))
    sources = []
    for name in order:
        cols = [i for i, n in enumerate(names) if n == name]
        cols.sort(key=lambda i: features[i] != name)  # the canonical spelling wins
        sources.append(tuple(cols))
    return tuple(order), tuple(sources), tuple(scale_of(f) for f in features)


def canonical_batch(batch: StepBatch) -> StepBatch:
    """The batch with canonical feature names and values in canonical units.

    Where a canonical column and an alias of it are both present, a rank's canonical value
    wins and its alias value fills in only where the canonical one is missing.
    """
    plan = _plan(batch.features)
    if plan is None:
        return batch
    names, sources, scales = plan
    present = batch.present if batch.present is not None else ~np.isnan(batch.values)
    values = np.full((len(batch.ranks), len(names)), np.nan, order="F")
    mask = np.zeros(values.shape, dtype=bool, order="F")
    for j, cols in enumerate(sources):
        for col in reversed(cols):  # the preferred column last, so it overwrites
            rows = present[:, col]
            values[rows, j] = batch.values[rows, col] * scales[col]
            mask[rows, j] = True
    return replace(batch, features=names, values=values, present=mask)


def canonical_frame(frame: Frame) -> Frame:
    """The frame with canonical names and units (the same frame when nothing changes)."""
    if all(canonical_name(name) == name for name in frame.values):
        return frame
    return replace(frame, values=canonical_values(frame.values))
