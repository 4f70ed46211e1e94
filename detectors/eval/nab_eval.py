"""NAB evaluation of the univariate detector over a corpus folder."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from detectors.eval.nab import PROFILES, FileScore, normalised_score, probation_length, score_file
from detectors.eval.nab_corpus import load_corpus
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


def evaluate_nab(
    root: Path, detector: RecordDetector | None = None, probation_cap: int | None = 5000
) -> NabResult:
    """Runs the detector on every file of the corpus and scores it under each profile.

    The detector sees only the values and the probation length, never the labels.
    """
    det = detector or RecordDetector()
    per_profile: dict[str, list[FileScore]] = {p.name: [] for p in PROFILES}
    files = 0
    for nab_file in load_corpus(root):
        files += 1
        probation = probation_length(len(nab_file.values), cap_rows=probation_cap)
        flags = det.detect(nab_file.values, probation).flags
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
    )
