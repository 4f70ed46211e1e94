"""Leave-one-category-out on the NAB corpus: constants chosen on five categories, scored on
the sixth.

NAB's files come in categories (artificial series with and without anomalies, AWS
CloudWatch metrics, ad-exchange prices, traffic sensors, tweet volumes). A detector whose
constants were chosen on the whole corpus has seen every kind of series it is scored on;
one held-out category at a time shows what it does on a kind it has not seen. For each
category and profile, the setting of ``GRID`` with the best normalised score on the other
categories is scored on the held-out one. Reported beside each: Numenta HTM's published
score on the same files (``HTM``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from detectors.eval.nab import (
    PROFILES,
    FileScore,
    Profile,
    normalised_score,
    score_file,
)
from detectors.eval.nab_corpus import NabFile, load_corpus
from detectors.eval.nab_families import Family, RecordFamily
from detectors.univariate import RecordDetector

#: The constants the protocol chooses, with the values tried (the shipped ones among
#: them): record span and quiet spell in probations, sustained-trigger z, relaxed bar,
#: season correlation (2.0: never a season), warm-up in probations, short-term predictor
#: length in points (0: none).
GRID: Mapping[str, tuple[float, ...]] = {
    "record": (1.0, 2.0, 4.0),
    "sustain_z": (3.0, 4.5),
    "relaxed": (0.5, 1.0),
    "quiet": (2.0, 4.0),
    "season_corr": (0.6, 0.8, 2.0),
    "warmup": (0.0, 0.25),
    "predictor": (0.0, 8.0, 32.0),
}
Setting = tuple[float, ...]

#: Numenta HTM's published NAB scores on the files of each category held here, from NAB's
#: results/numenta/numenta_<profile>_scores.csv (github.com/numenta/NAB, commit ea702d7),
#: normalised per category as NAB normalises the corpus: (raw + A_FN * windows) /
#: ((A_TP + A_FN) * windows). A category without windows has no normalised score: its
#: raw score is given (0 is perfect; each false positive costs).
HTM: Mapping[str, Mapping[str, float]] = {
    "standard": {
        "artificialNoAnomaly": -0.44,
        "artificialWithAnomaly": 70.22,
        "realAWSCloudwatch": 73.42,
        "realAdExchange": 76.86,
        "realTraffic": 82.51,
        "realTweets": 68.02,
    },
    "reward_low_FP_rate": {
        "artificialNoAnomaly": -0.44,
        "artificialWithAnomaly": 68.43,
        "realAWSCloudwatch": 65.79,
        "realAdExchange": 67.71,
        "realTraffic": 75.73,
        "realTweets": 61.06,
    },
    "reward_low_FN_rate": {
        "artificialNoAnomaly": -0.44,
        "artificialWithAnomaly": 74.59,
        "realAWSCloudwatch": 76.72,
        "realAdExchange": 79.81,
        "realTraffic": 85.96,
        "realTweets": 72.62,
    },
}


def detector_for(setting: Setting, probation: int) -> RecordDetector:
    """The detector of a grid setting for a file of the given probation."""
    record, sustain_z, relaxed, quiet, season_corr, warmup, predictor = setting
    span = max(probation, 50)
    return RecordDetector(
        record_window=int(record * span),
        sustain_z=sustain_z,
        relaxed=relaxed,
        quiet=int(quiet * span),
        season_corr=season_corr,
        warmup=int(warmup * probation),
        predictor=int(predictor),
    )


def settings() -> Iterator[Setting]:
    return itertools.product(*GRID.values())


@dataclass(frozen=True)
class Held:
    """One held-out category under one profile."""

    category: str
    profile: str
    setting: Setting
    score: float  # normalised; the raw score for a category without windows
    raw: float
    false_positives: int
    windows: int
    htm: float


def category(name: str) -> str:
    return name.split("/")[0]


def file_scores(files: Sequence[NabFile], setting: Setting) -> dict[str, list[FileScore]]:
    """Each profile's per-file scores of a RecordDetector setting."""
    return score_flags(files, RecordFamily().flags(files, setting))


def score_flags(
    files: Sequence[NabFile], flags: Sequence[np.ndarray]
) -> dict[str, list[FileScore]]:
    """Each profile's per-file scores of one boolean flag array per file."""
    out: dict[str, list[FileScore]] = {p.name: [] for p in PROFILES}
    for f, fl in zip(files, flags, strict=True):
        for p in PROFILES:
            out[p.name].append(score_file(fl, f.windows, p))
    return out


def _score(scores: Sequence[FileScore], profile: Profile) -> float:
    if sum(s.windows for s in scores) == 0:
        return sum(s.raw for s in scores)
    return normalised_score(scores, profile)


@dataclass(frozen=True)
class LocoResult:
    """Every held-out category; per profile the mean over categories with windows, and
    the pooled score of all held-out verdicts normalised over the whole corpus."""

    held: tuple[Held, ...]
    mean: Mapping[str, float]
    pooled: Mapping[str, float]
    #: The best setting's score on the whole corpus (every category seen): not held out.
    whole: Mapping[str, float]


#: How the setting is chosen on the other categories: ``pooled``, their files' verdicts
#: normalised together (NAB's corpus score; the categories with more windows weigh
#: more); ``mean``, the mean of their per-category normalised scores (the held-out
#: statistic reported, each category one vote); ``min``, the worst of those (maximin: the
#: setting that does least badly on the kind of series it suits least).
SELECTIONS = ("pooled", "mean", "min")

Table = Mapping[Setting, Mapping[str, list[FileScore]]]


def score_table(
    files: Sequence[NabFile], family: Family
) -> dict[Setting, dict[str, list[FileScore]]]:
    """Every setting's per-file scores under every profile."""
    return {s: score_flags(files, family.flags(files, s)) for s in family.settings()}


def leave_one_out(root: Path, family: Family | None = None, select: str = "pooled") -> LocoResult:
    """Every category held out under every profile, constants chosen on the others.

    ``family`` (default: the shipped RecordDetector's grid) gives the settings tried and
    each setting's flags on every file; ``select`` (``SELECTIONS``) how a setting is
    judged on the other categories.
    """
    files = list(load_corpus(root))
    return held_out(files, score_table(files, family or RecordFamily()), select)


def _judge(
    scores: Sequence[FileScore], profile: Profile, groups: Sequence[np.ndarray], select: str
) -> float:
    """A setting's score on the categories of ``groups`` (file indices), as ``select`` says."""
    if select == "pooled":
        return _score([scores[i] for g in groups for i in g], profile)
    per = [
        normalised_score([scores[i] for i in g], profile)
        for g in groups
        if sum(scores[i].windows for i in g)
    ]
    return float(np.mean(per) if select == "mean" else np.min(per))


def held_out(files: Sequence[NabFile], table: Table, select: str = "pooled") -> LocoResult:
    """The protocol on a table of scores (``score_table``) already computed."""
    if select not in SELECTIONS:
        raise ValueError(f"select must be one of {', '.join(SELECTIONS)}, got {select!r}")
    cats = np.array([category(f.name) for f in files])
    names = sorted(set(cats))
    held, pooled = [], {}
    for profile in PROFILES:
        verdicts: list[FileScore] = []
        for cat in names:
            inside = np.flatnonzero(cats == cat)
            groups = [np.flatnonzero(cats == c) for c in names if c != cat]

            best = max(
                table, key=lambda st: _judge(table[st][profile.name], profile, groups, select)
            )
            scores = [table[best][profile.name][i] for i in inside]
            verdicts += scores
            held.append(
                Held(
                    cat,
                    profile.name,
                    best,
                    _score(scores, profile),
                    sum(s.raw for s in scores),
                    sum(s.fp for s in scores),
                    sum(s.windows for s in scores),
                    HTM[profile.name].get(cat, float("nan")),
                )
            )
        pooled[profile.name] = normalised_score(verdicts, profile)
    mean = {
        p.name: float(np.mean([h.score for h in held if h.profile == p.name and h.windows]))
        for p in PROFILES
    }
    every = np.arange(len(files))
    whole = {
        p.name: max(_score([table[s][p.name][i] for i in every], p) for s in table)
        for p in PROFILES
    }
    return LocoResult(tuple(held), mean, pooled, whole)
