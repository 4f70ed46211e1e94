"""NAB evaluation of a univariate detector over a corpus folder."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from detectors.errors import DetectorError
from detectors.eval.nab import PROFILES, FileScore, normalised_score, probation_length, score_file
from detectors.eval.nab_corpus import load_corpus
from detectors.eval.nab_detectors import DEFAULT_DETECTOR, nab_detector
from detectors.univariate import RecordDetector


@dataclass(frozen=True)
class NabResult:
    """Normalised score per profile, and the standard profile's counts."""

    scores: dict[str, float]
    files: int
    windows: int
    tp: int
    fp: int
    fn: int
    detector: str = DEFAULT_DETECTOR


def evaluate_nab(
    root: Path,
    detector: RecordDetector | None = None,
    probation_cap: int | None = 5000,
    name: str = DEFAULT_DETECTOR,
) -> NabResult:
    """Runs a detector on every file of the corpus and scores it under each profile.

    ``name`` picks the detector (detectors/eval/nab_detectors.py: ``artime`` or
    ``record``); a ``RecordDetector`` given as ``detector`` is run instead. A detector is
    given what NAB's harness gives one (the values, the probation length and the file's
    minimum and maximum), never the labels.

    Raises:
        DetectorError: an unknown ``name``, or a corpus that cannot be read.
    """
    run = nab_detector(name)
    if detector is not None:
        given = detector
        name = "record"

        def run(values: np.ndarray, probation: int, low: float, high: float) -> np.ndarray:
            return given.detect(values, probation).flags

    per_profile: dict[str, list[FileScore]] = {p.name: [] for p in PROFILES}
    files = 0
    for nab_file in load_corpus(root):
        files += 1
        probation = probation_length(len(nab_file.values), cap_rows=probation_cap)
        values = nab_file.values
        if not len(values):
            raise DetectorError(f"{nab_file.name}: no rows; drop it from windows.json")
        try:
            flags = run(values, probation, float(values.min()), float(values.max()))
        except DetectorError as e:
            raise DetectorError(f"{nab_file.name}: {e}") from None
        for p in PROFILES:
            per_profile[p.name].append(
                score_file(flags, nab_file.windows, p, probation_cap=probation_cap)
            )
    standard = per_profile[PROFILES[0].name]
    return NabResult(
        {p.name: normalised_score(per_profile[p.name], p) for p in PROFILES},
        files,
        sum(s.windows for s in standard),
        sum(s.tp for s in standard),
        sum(s.fp for s in standard),
        sum(s.fn for s in standard),
        name,
    )
