"""The detectors ``eagleeye eval nab`` scores, each given only what NAB's harness gives one.

NAB's harness hands every detector, before the first row, the file's minimum and maximum
(``inputMin``, ``inputMax``) and the probation length; the detector then sees the rows one
at a time and chooses its own threshold.

- ``artime_discord_extreme`` (the default): ARTime's detections (below) kept only where
  the recent shape is rare for the file (its discord over the last half feature window
  ranks at least ``DISCORD_BAR`` among the file's earlier discords, stretches of
  ``DISCORD_M`` values; detectors/eval/nab_artime_confirm.py), united with the
  new-extreme trigger (a value beyond every earlier value's range by more than
  ``EXTREME_MARGIN`` of that range; detectors/eval/nab_extreme.py), within ARTime's rest
  (detectors/eval/nab_artime_extreme.py): the setting the leave-one-category-out
  protocol chose for four of the six held-out categories in the standard profile (with
  ad exchange or traffic held out: margin 0.02) (docs/benchmarks.md, "NAB: ARTime with a
  discord confirmation and a new-extreme trigger").
- ``artime``: ARTime (detectors/eval/nab_artime.py) scaled by that range, with its
  published constants, a score threshold of 0.3 and a rest of 8 blocks (one feature
  window) after each detection kept (detectors/eval/nab_artime_rest.py; "NAB: ARTime with
  a rest period").
- ``record``: the project's own RecordDetector (detectors/univariate.py), which uses the
  probation only.

All are online: a verdict uses the rows up to it (and, for the ARTime ones, the range).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from detectors.errors import DetectorError
from detectors.eval.nab_artime import artime_scores
from detectors.eval.nab_artime_confirm import confirm_flags
from detectors.eval.nab_artime_rest import rest_flags, rest_rows
from detectors.eval.nab_discord import discord_scores
from detectors.eval.nab_extreme import new_extreme_flags
from detectors.univariate import RecordDetector

#: A NAB detector: (values, probation, file minimum, file maximum) -> one flag per row.
NabDetector = Callable[[np.ndarray, int, float, float], np.ndarray]

#: ARTime's score threshold shipped (chosen by the protocol, docs/benchmarks.md).
ARTIME_THRESHOLD = 0.3
#: ARTime's rest after a detection kept, in its blocks (chosen by the protocol).
ARTIME_REST_BLOCKS = 8.0
#: The discord confirmation: the rank a detection's recent shape needs among the file's
#: earlier discords, and the stretches' length (chosen by the protocol).
DISCORD_BAR = 0.9
DISCORD_M = 16
#: Earlier stretches the discord searches at least (a longer series searches no further
#: back, so its cost grows linearly): longer than any file of NAB's corpus, whose
#: verdicts it leaves as with the whole history.
DISCORD_HORIZON = 25_000
#: The new-extreme trigger's margin, a fraction of the earlier values' range (chosen by
#: the protocol).
EXTREME_MARGIN = 0.05


@dataclass(frozen=True)
class SeriesVerdict:
    """A detector's score of every row and the rows it flags (its own threshold)."""

    scores: np.ndarray
    flags: np.ndarray


def artime_verdict(values: np.ndarray, probation: int, low: float, high: float) -> SeriesVerdict:
    """ARTime's scores; flagged: a new cluster scoring at least ``ARTIME_THRESHOLD``, less
    those within ``ARTIME_REST_BLOCKS`` blocks after the last detection kept."""
    scores = artime_scores(values, low, high, probation=probation)
    kept = np.asarray(scores >= ARTIME_THRESHOLD, dtype=bool) & (scores > 0)
    return SeriesVerdict(scores, rest_flags(kept, rest_rows(ARTIME_REST_BLOCKS, probation)))


def artime_discord_extreme_verdict(
    values: np.ndarray, probation: int, low: float, high: float
) -> SeriesVerdict:
    """ARTime's detections (``artime_verdict``'s candidates and rest) that the discord rule
    confirms, or a new extreme, none within ARTime's rest after the last one kept; the
    score is ARTime's, 1 at a new extreme."""
    scores = artime_scores(values, low, high, probation=probation)
    confirmed = confirm_flags(
        scores,
        values,
        probation,
        low,
        high,
        ARTIME_THRESHOLD,
        rest_rows(ARTIME_REST_BLOCKS, probation),
        (4.0, DISCORD_BAR, float(DISCORD_M)),
        discord=discord_scores(values, probation, DISCORD_M, horizon=DISCORD_HORIZON),
    )
    extreme = new_extreme_flags(values, probation, EXTREME_MARGIN)
    flags = rest_flags(confirmed | extreme, rest_rows(ARTIME_REST_BLOCKS, probation))
    return SeriesVerdict(np.where(extreme, 1.0, scores), flags)


def record_verdict(values: np.ndarray, probation: int, low: float, high: float) -> SeriesVerdict:
    """The RecordDetector's scores and detections (shipped constants; no use of the range)."""
    del low, high
    result = RecordDetector().detect(values, probation)
    return SeriesVerdict(np.asarray(result.scores), np.asarray(result.flags, dtype=bool))


def artime_flags(values: np.ndarray, probation: int, low: float, high: float) -> np.ndarray:
    """ARTime's detections (``artime_verdict``'s flags)."""
    return artime_verdict(values, probation, low, high).flags


def artime_discord_extreme_flags(
    values: np.ndarray, probation: int, low: float, high: float
) -> np.ndarray:
    """The default detector's detections (``artime_discord_extreme_verdict``'s flags)."""
    return artime_discord_extreme_verdict(values, probation, low, high).flags


def record_flags(values: np.ndarray, probation: int, low: float, high: float) -> np.ndarray:
    """The RecordDetector's detections (``record_verdict``'s flags)."""
    return record_verdict(values, probation, low, high).flags


VERDICTS: Mapping[str, Callable[[np.ndarray, int, float, float], SeriesVerdict]] = {
    "artime_discord_extreme": artime_discord_extreme_verdict,
    "artime": artime_verdict,
    "record": record_verdict,
}
DETECTORS: Mapping[str, NabDetector] = {
    "artime_discord_extreme": artime_discord_extreme_flags,
    "artime": artime_flags,
    "record": record_flags,
}
DEFAULT_DETECTOR = "artime_discord_extreme"


def nab_detector(name: str) -> NabDetector:
    """The detector called ``name``.

    Raises:
        DetectorError: no detector has that name.
    """
    _known(name)
    return DETECTORS[name]


def series_verdict(name: str, values: np.ndarray, probation: int) -> SeriesVerdict:
    """The verdict of detector ``name`` on a whole series, given what NAB's harness gives
    a detector: the probation and the series' minimum and maximum.

    Raises:
        DetectorError: no detector has that name, or the series has no rows.
    """
    _known(name)
    if not len(values):
        raise DetectorError("the series has no rows")
    return VERDICTS[name](values, probation, float(np.min(values)), float(np.max(values)))


def _known(name: str) -> None:
    if name not in DETECTORS:
        raise DetectorError(
            f"unknown NAB detector {name!r}: choose one of {', '.join(sorted(DETECTORS))}"
        )
