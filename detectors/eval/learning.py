"""Learned scorers fitted on a healthy trace, run beside the configured detectors.

``fit_scorers`` passes a healthy trace through the detectors' edge, keeps every complete,
warm vector of every rank (a random ``window`` of them when there are more) and fits each
scorer on them; its threshold starts from the scores of a held-out quarter. ``run_with``
runs a pipeline with the scorers added and can write every scored vector (``--scores``),
for threshold-free measures such as AUC-PR.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from detectors.config import DetectorsConfig
from detectors.edge import Edge
from detectors.errors import DetectorError
from detectors.eval.runner import Emitted
from detectors.eval.trace import Trace, read_trace
from detectors.learned import LearnedScorer


def fit_scorers(
    healthy: Path | Trace, names: Sequence[str], refit_every: int = 0, window: int = 20000
) -> list[LearnedScorer]:
    """Scorers of the named models fitted on a healthy trace (frozen unless refit_every).

    Raises:
        DetectorError: an unknown model, or too few healthy vectors to fit.
    """
    trace = read_trace(healthy) if isinstance(healthy, Path) else healthy
    out = []
    for name in names:
        params = {"window": 8} if name == "lstm_vae" else {}
        scorer = LearnedScorer(
            name,
            window=window,
            min_fit=min(512, window),
            refit_every=refit_every,
            model_params=params,
        )
        collected: list[np.ndarray] = []
        edge = Edge()
        for batch in trace.batches():
            _, windows = scorer._windows(edge.batch(batch))  # the vectors it would score
            collected.extend(windows)
        if len(collected) < 64:
            raise DetectorError(
                f"{name}: the healthy trace gave {len(collected)} complete vectors; "
                "at least 64 are needed to fit (a longer healthy run?)"
            )
        rng = np.random.default_rng(0)
        pick = rng.permutation(len(collected))[:window]
        scorer.fit_windows(np.stack([collected[i] for i in pick]))
        scorer.reset_stream()
        out.append(scorer)
    return out


def run_with(
    trace: Trace,
    config: DetectorsConfig,
    scorers: Sequence[LearnedScorer],
    scores: Path | None = None,
) -> list[Emitted]:
    """Runs the pipeline with the scorers added; writes each scored vector to ``scores``."""
    pipeline = config.build()
    pipeline.detectors += list(scorers)
    writer, handle = None, None
    if scores is not None:
        handle = scores.open("w", newline="")
        writer = csv.writer(handle)
        writer.writerow(["step", "time", "rank", "scorer", "score", "threshold"])
    out: list[Emitted] = []
    step, time = 0, 0.0
    try:
        for batch in trace.batches():
            step, time = batch.step, batch.time
            out += [Emitted(f, step, time) for f in pipeline.process_step(batch)]
            if writer is not None:
                for scorer in scorers:
                    limit = scorer.threshold()
                    for rank, score in scorer.scored():
                        writer.writerow([step, time, rank, scorer.name, score, limit])
        out += [Emitted(f, step, time) for f in pipeline.flush()]
    finally:
        if handle is not None:
            handle.close()
    return out
