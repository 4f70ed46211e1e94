"""The Numenta Anomaly Benchmark (NAB) score, reimplemented from its published definition.

Each labelled window rewards its earliest detection by a scaled sigmoid of the detection's
position (+A_TP at the window's first row, 0 at its last); every detection outside windows
costs A_FP times a scaled sigmoid of its distance past the previous window (the full A_FP
far from any window); every window without a detection costs A_FN. Detections in the
probationary period (the first 15 % of each file, at most 750 rows as in NAB's code) are
ignored. As in NAB's sweeper, only the earliest detection in a window counts (later ones
neither earn nor cost), and a window lying wholly in the probation is not scored at all.
The corpus total is normalised as NAB's runner does: 0 is the null detector's total (a miss
for every scored window) and 100 is the perfect detector's (A_TP for every labelled
window), so the null detector scores 0 and, whenever every window reaches past the
probation (true of NAB's corpus), the perfect detector (one detection at the first row of
each window) scores 100.

>>> import numpy as np
>>> windows = [(40, 49)]
>>> perfect = np.zeros(100, dtype=bool); perfect[40] = True
>>> round(normalised_score([score_file(perfect, windows, STANDARD)], STANDARD), 6)
100.0
>>> round(normalised_score([score_file(np.zeros(100, bool), windows, STANDARD)], STANDARD), 6)
0.0
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from detectors.errors import DetectorError


@dataclass(frozen=True, slots=True)
class Profile:
    """NAB's cost matrix: the weights of true positives, false positives and misses."""

    name: str
    tp: float
    fp: float
    fn: float


STANDARD = Profile("standard", tp=1.0, fp=0.11, fn=1.0)
REWARD_LOW_FP = Profile("reward_low_FP_rate", tp=1.0, fp=0.22, fn=1.0)
REWARD_LOW_FN = Profile("reward_low_FN_rate", tp=1.0, fp=0.11, fn=2.0)
PROFILES = (STANDARD, REWARD_LOW_FP, REWARD_LOW_FN)
PROBATION_FRACTION = 0.15
#: NAB's code caps the probation at 15 % of 5000 rows; its published scores use that cap.
PROBATION_CAP_ROWS = 5000


@dataclass(frozen=True, slots=True)
class FileScore:
    """Raw NAB score parts of one file under one profile."""

    raw: float
    tp: int
    fp: int
    fn: int
    windows: int
    #: Windows with at least one row past the probation; NAB scores only these.
    scored_windows: int


def scaled_sigmoid(position: float) -> float:
    """NAB's reward curve: about +1 at position -1 (window start), 0 at 0, -1 beyond 3."""
    if position >= 3.0:
        return -1.0
    return 2.0 / (1.0 + math.exp(5.0 * position)) - 1.0


def probation_length(
    n_rows: int, fraction: float = PROBATION_FRACTION, cap_rows: int | None = PROBATION_CAP_ROWS
) -> int:
    """Rows at the start of a file in which detections are not scored.

    NAB's ``getProbationPeriod``: ``min(floor(fraction * n), fraction * cap_rows)``;
    ``cap_rows=None`` gives the uncapped 15 % of every file.
    """
    length = math.floor(fraction * n_rows)
    if cap_rows is not None:
        length = min(length, math.floor(fraction * cap_rows))
    return int(length)


def score_file(
    detections: np.ndarray,
    windows: Sequence[tuple[int, int]],
    profile: Profile,
    probation_fraction: float = PROBATION_FRACTION,
    probation_cap: int | None = PROBATION_CAP_ROWS,
) -> FileScore:
    """Scores one file's boolean detections against its windows (inclusive row indices).

    Raises:
        DetectorError: windows overlap, are out of order or fall outside the file.
    """
    flags = np.asarray(detections, dtype=bool)
    n = len(flags)
    _check_windows(windows, n)
    probation = probation_length(n, probation_fraction, probation_cap)
    hits = np.flatnonzero(flags)
    hits = hits[hits >= probation]
    max_tp = scaled_sigmoid(-1.0)
    raw = 0.0
    tp = fn = fp = 0
    scored = 0
    for left, right in windows:
        if right < probation:
            continue
        scored += 1
        inside = hits[(hits >= left) & (hits <= right)]
        if len(inside):
            width = right - left + 1
            position = -(right - inside[0] + 1) / width
            raw += scaled_sigmoid(position) * profile.tp / max_tp
            tp += 1
        else:
            raw -= profile.fn
            fn += 1
    for i in hits:
        cost = _false_positive_cost(int(i), windows)
        if cost is not None:
            raw += cost * profile.fp
            fp += 1
    return FileScore(raw, tp, fp, fn, len(windows), scored)


def _false_positive_cost(i: int, windows: Sequence[tuple[int, int]]) -> float | None:
    """None inside a window; else the (negative) scaled sigmoid past the previous window."""
    previous: tuple[int, int] | None = None
    for left, right in windows:
        if left <= i <= right:
            return None
        if right < i:
            previous = (left, right)
    if previous is None:
        return -1.0
    left, right = previous
    width = right - left + 1
    # NAB divides by (width - 1); guard one-row windows, which NAB never produces.
    return scaled_sigmoid(abs(right - i) / max(width - 1, 1))


def _check_windows(windows: Sequence[tuple[int, int]], n: int) -> None:
    last = -1
    for left, right in windows:
        if not 0 <= left <= right < n or left <= last:
            raise DetectorError(
                f"bad NAB window ({left}, {right}) for a file of {n} rows: windows must be "
                "ordered, disjoint and inside the file"
            )
        last = right


def null_and_perfect(scores: Sequence[FileScore], profile: Profile) -> tuple[float, float]:
    """The corpus totals of the null detector and the perfect detector, as NAB's runner.

    The null total counts a miss for each scored window; the perfect total rewards every
    labelled window, including any lying wholly in the probation.
    """
    null = -profile.fn * sum(s.scored_windows for s in scores)
    return null, profile.tp * sum(s.windows for s in scores)


def normalised_score(scores: Sequence[FileScore], profile: Profile) -> float:
    """100 * (raw - null) / (perfect - null) over a corpus of files.

    Raises:
        DetectorError: the corpus has no labelled window, so the score is undefined.
    """
    null, perfect = null_and_perfect(scores, profile)
    if perfect == null:
        raise DetectorError("the NAB score needs at least one labelled window in the corpus")
    raw = sum(s.raw for s in scores)
    return 100.0 * (raw - null) / (perfect - null)
