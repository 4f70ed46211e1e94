"""Effective training time ratio (ETTR): one function for the summary and the exporter.

The terminal summary (eagleeye.summary) computes it from the run store after the run; the
Prometheus exporter (eagleeye.exporter) computes it from the samples it has seen while the
run goes on. Both call :func:`effective_training` on the same table, so the figure on the
dashboard, in Prometheus and in the summary is the same for the same samples.

>>> import pandas as pd
>>> rows = [("step_time", s, 0.5, 10.0 + 0.5 * s, 0) for s in range(5)]
>>> steps = pd.DataFrame(rows, columns=list(STEP_COLUMNS))
>>> effective_training(steps, replicas=1)
(1.0, 0.0)
"""

from __future__ import annotations

import math

import pandas as pd

#: The columns :func:`effective_training` reads (a run store's sample table has them).
STEP_COLUMNS = ("name", "step", "value", "time", "attempt")


def effective_training(steps: pd.DataFrame, replicas: int) -> tuple[float, float]:
    """Effective training time ratio (ETTR) and the seconds lost, over the training window.

    Each distinct step is worth the median step time, scaled by the share of replicas that
    contributed a gradient to it (all of them unless ``replicas`` samples say otherwise). A
    step redone after a restart counts once. The window runs from the end of the first step
    to the end of the last, so start-up is not counted against either recovery.

    Args:
        steps: samples with the columns of :data:`STEP_COLUMNS`; rows named ``step_time``
            and ``replicas`` are read, others ignored.
        replicas: the replicas of the job (the denominator of the share).

    Returns:
        ``(ettr, lost_s)``; both NaN before two distinct steps are known.
    """
    times = steps[steps["name"] == "step_time"]
    if times["step"].nunique() < 2:
        return math.nan, math.nan
    first = times.loc[times["step"] == times["step"].min(), "time"].min()
    window = float(times["time"].max() - first)
    share = pd.Series(1.0, index=sorted(times["step"].unique()))
    counts = steps[steps["name"] == "replicas"]
    if not counts.empty and replicas > 0:
        share.update(counts.groupby("step")["value"].max() / replicas)
    useful = float(share.iloc[1:].sum()) * float(times["value"].median())
    return (useful / window if window > 0 else math.nan), window - useful


__all__ = ["STEP_COLUMNS", "effective_training"]
