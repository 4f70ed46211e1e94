"""Design changes to the univariate NAB detector that were tried and rejected, measured.

Each variant changes one part of ``RecordDetector`` (the score, the sustained trigger or
the record a candidate must beat). Without arguments, every variant is run on the whole
corpus at the shipped setting and its standard-profile score is printed per category (a
screen, not a held-out figure). With ``--loco VARIANT``, the leave-one-category-out
protocol of detectors/eval/nab_loco.py is run with the variant as one more grid axis
(off or on, chosen on the other five categories like every other constant; the grid's
predictor axis held at 0), so a design is judged by held-out figures. The predictor
variants are the design RecordDetector's ``predictor`` now ships (chosen by the grid).
With ``--family discord``, ``discord_sustained`` or ``discord_fusion``, a different
detector family (detectors/eval/nab_discord.py: the distance of the recent stretch to its
nearest earlier one, alone, with a sustained trigger, or joined with the record detector
by a rule the grid chooses) is judged by the same protocol, every held-out category
printed beside HTM's published score. ``--zero-fp-bound`` prints, per category, what the
record detector (shipped constants, 32-point predictor) and its union with the discord
would score with every flag outside a window removed: the most that fewer false
positives alone could give.

``--family likelihood``, ``rank_mean`` or ``likelihood_fusion`` judges the anomaly
likelihood designs of detectors/eval/nab_likelihood.py the same way; every ``--family``
run also prints the family's ceiling per category (its best setting chosen on that
category's own labels: not a held-out figure). ``--missed`` prints the AWS CloudWatch
windows the record detector misses, their values beside the file's history and how high
each score ranks them. ``--family extreme_record`` judges the record detector's grid
with a new-extreme trigger (detectors/eval/nab_extreme.py) off or at a margin.
``--family artime`` judges ARTime (detectors/eval/nab_artime.py: adaptive resonance theory
over downsampled, wavelet-coded stretches, scaled by each file's minimum and maximum as
NAB hands them to every detector) over a grid of its own constants and a score threshold;
``artime_probation``, ``artime_running`` and ``artime_expanding`` the same scaled by ranges
that look no further than the rows seen (the probation's widened by half its span, levels
beyond it clipped; the running min and max; the widened probation range stretched by the
running one, its widening a constant chosen by the protocol). Each also prints the
published constants' score per category on the whole corpus (a screen).
``--family artime_fusion`` judges ARTime (file range) joined with the record detector,
the new-extreme trigger or both, by a rule the protocol chooses
(detectors/eval/nab_artime_fusion.py); ``--family record_file_range`` the record detector
over its grid handed each file's minimum and maximum where a range enters (its scale's
floor and its novelty term), the like-for-like check beside ARTime's file range.
``--family artime_rest`` judges ARTime with a rest after each detection kept, the rest
(0 to 12 of its blocks) a constant the protocol chooses (detectors/eval/
nab_artime_rest.py); ``artime_rest_probation`` the same with rests of 0 to 0.5
probations. ``--artime-screen`` screens ARTime with one of its constants changed at a time
and k-of-n votes of those runs (whole corpus, threshold 0.3, rest 8 blocks).
``--family artime_confirm`` judges ARTime with a rest and a rule that must confirm each
detection (evidence in the values, or the file's own score record; detectors/eval/
nab_artime_confirm.py), the rule a constant the protocol chooses; ``artime_confirm_discord``
the same with the discord rule (how new the recent shape is among the file's earlier
ones) in place of those rules, and ``artime_discord_extreme`` that family united with the
new-extreme trigger (detectors/eval/nab_artime_extreme.py); ``--artime-detections``
lists every detection of ``eagleeye eval nab``'s default ARTime on AWS CloudWatch and ad
exchange with its verdict, score and that evidence. ``--family artime_adaptive`` judges
ARTime with a setting chosen per file from its own probation (a strict threshold and rest
where the fraction of probation points beyond k robust spreads reaches a cut-off; the
shipped setting elsewhere; detectors/eval/nab_artime_adaptive.py), and prints the files
each standard fold's rule scores strictly; ``artime_adaptive_jump`` the same with the
probation's largest step over its median step as a second characteristic the protocol
may choose.

Run: .venv/bin/python benchmarks/nab_designs.py [--root ../shared/data/nab] [--loco NAME]
     [--family discord|discord_sustained|discord_fusion|likelihood|rank_mean|
     likelihood_fusion|extreme_record|artime|artime_probation|artime_running|
     artime_expanding|artime_fusion|artime_rest|artime_rest_probation|artime_confirm|
     artime_confirm_discord|artime_discord_extreme|artime_adaptive|artime_adaptive_jump|record_file_range]
     [--zero-fp-bound] [--missed] [--artime-screen] [--artime-detections]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from detectors._season import season_length
from detectors.eval import nab_loco
from detectors.eval.nab import PROFILES, STANDARD, FileScore, probation_length, score_file
from detectors.eval.nab_artime import ArtimeConfig, ArtimeFamily, artime_scores
from detectors.eval.nab_artime_adaptive import ArtimeAdaptiveFamily, choose
from detectors.eval.nab_artime_confirm import DISCORD_RULES, ArtimeConfirmFamily, evidence
from detectors.eval.nab_artime_extreme import ArtimeExtremeFamily
from detectors.eval.nab_artime_fusion import ArtimeFusionFamily
from detectors.eval.nab_artime_rest import ArtimeRestFamily, rest_flags, rest_rows
from detectors.eval.nab_corpus import NabFile, load_corpus
from detectors.eval.nab_discord import (
    DISCORD_SUSTAINED_GRID,
    DiscordFamily,
    DiscordRecordFamily,
    discord_scores,
    record_flags,
)
from detectors.eval.nab_extreme import ExtremeRecordFamily
from detectors.eval.nab_families import Family, RecordFamily
from detectors.eval.nab_likelihood import LikelihoodFamily, LikelihoodRecordFamily, RankMeanFamily
from detectors.univariate import RecordDetector, SeriesResult, _robust_z, _seasonal_residual

#: nab_loco's own detector_for (``loco`` replaces the module's with a variant's).
SHIPPED_DETECTOR_FOR = nab_loco.detector_for
#: The shipped setting of nab_loco.GRID (record, sustain_z, relaxed, quiet, season, warm-up,
#: predictor): the variants are measured against the detector without a predictor.
SHIPPED = (4.0, 3.0, 0.5, 4.0, 0.8, 0.25, 0.0)


class Designed(RecordDetector):
    """RecordDetector with one of the tried design changes switched on.

    Options: ``log_heavy`` (log1p of a non-negative series whose probation's 99th
    percentile exceeds 3 times its median), ``predictor`` (k > 0: also the robust z of the
    value less the median of its last k values, a short-term predictor's error),
    ``mad_floor`` (the scale's floor as a fraction of the trailing range; shipped 0.02),
    ``likelihood`` ("raw" or "log": the sustained trigger as Numenta's anomaly likelihood,
    the mean of the last 10 scores against the mean and SD of the scores themselves, on
    the scores or their log1p), ``bar`` ("record"; "tail": a threshold extrapolated from an
    exponential tail fitted to the history's 90th to 99th percentiles, about one chance
    exceedance per four record spans; "decay": a record whose old scores fade with a time
    constant of half the record span), ``early_guard`` (a: the bar times (span / points
    seen) ** a while the history is shorter than the span), ``remember`` (below 1: an
    alarm's span keeps in the history at most the larger of the record it beat and
    ``remember`` times its score), ``file_range`` (where a range enters, the file's own
    minimum and maximum, as NAB hands them to every detector: the scale's floor is 2 % of
    the file's span instead of the trailing window's, and the novelty term's excess over
    the earlier range is divided by the file's span instead of the earlier range's).
    """

    def __init__(self, base: RecordDetector, **options: Any) -> None:
        super().__init__()
        self.__dict__.update(base.__dict__)
        self.log_heavy = bool(options.get("log_heavy", False))
        self.predictor = int(options.get("predictor", 0))
        self.mad_floor = float(options.get("mad_floor", 0.02))
        self.likelihood = options.get("likelihood")
        self.bar = str(options.get("bar", "record"))
        self.early_guard = float(options.get("early_guard", 0.0))
        self.remember = float(options.get("remember", 1.0))
        self.file_range = bool(options.get("file_range", False))
        self._file_span = 0.0

    def _z(self, s: pd.Series, window: int) -> pd.Series:
        if self.mad_floor == 0.02 and not self.file_range:
            return _robust_z(s, window)
        med = s.rolling(window, min_periods=20).median().shift(1)
        mad = (s - med).abs().rolling(window, min_periods=20).median().shift(1)
        roll = s.rolling(window, min_periods=20)
        spread = (roll.max() - roll.min()).shift(1).fillna(0.0)
        if self.file_range:
            spread = pd.Series(np.full(len(s), self._file_span))
        scale = np.maximum(1.4826 * mad, self.mad_floor * spread) + 1e-9
        return ((s - med).abs() / scale).fillna(0.0)

    def score(self, values: np.ndarray, probation: int) -> np.ndarray:
        x = np.asarray(values, dtype=float)
        head = x[:probation]
        if self.log_heavy and len(head) and head.min() >= 0:
            median = float(np.median(head))
            if np.quantile(head, 0.99) > 3 * median:
                x = np.log1p(np.maximum(x, 0.0) / max(median, 1e-9))
        s = pd.Series(np.asarray(x, dtype=float))
        self._file_span = float(s.max() - s.min()) if len(s) else 0.0
        window = self.window or max(probation, 50)
        season = season_length(s.to_numpy()[:probation], self.season_corr)
        base = _seasonal_residual(s, season) if season else s
        point = self._z(base, window)
        if self.predictor:
            error = base - base.rolling(self.predictor, min_periods=1).median().shift(1)
            point = pd.Series(np.maximum(point, self._z(error.fillna(0.0), window)))
        level = self._z(base.rolling(self.smooth, min_periods=1).mean(), window) * 0.7
        high, low = s.cummax().shift(1), s.cummin().shift(1)
        span = (high - low).replace(0.0, np.nan)
        if self.file_range:
            span = pd.Series(np.full(len(s), self._file_span or np.nan))
        beyond = pd.Series(np.maximum(s - high, low - s)) / span
        novelty = 20.0 * beyond.clip(lower=0.0).fillna(0.0)
        raw = np.array(
            np.minimum(np.maximum(np.maximum(point, level), novelty), self.ceiling), dtype=float
        )
        raw[: self.warmup if self.warmup is not None else probation // 4] = 0.0
        return raw

    def sustained(self, raw: np.ndarray, probation: int) -> np.ndarray:
        if self.likelihood is None:
            return super().sustained(raw, probation)
        r = pd.Series(np.log1p(raw) if self.likelihood == "log" else raw)
        recent = r.rolling(10, min_periods=1).mean()
        history = r.rolling(self._history(probation), min_periods=20)
        mean, std = history.mean().shift(10), history.std().shift(10)
        return np.asarray(((recent - mean) / (std + 1e-9)).fillna(0.0), dtype=float)

    def _bars(self, raw: np.ndarray, probation: int) -> np.ndarray:
        history = self._history(probation)
        if self.bar == "tail":
            h = pd.Series(raw).rolling(history, min_periods=20)
            lo, hi = h.quantile(0.9).shift(1), h.quantile(0.99).shift(1)
            beta = (hi - lo) / np.log(10.0)
            bar = hi + beta * np.log(4.0 * 0.01 * history)
            return np.asarray(bar.fillna(np.inf), dtype=float)
        if self.bar == "decay":
            keep = np.exp(-1.0 / (0.5 * history))
            out = np.full(len(raw), np.inf)
            best = -np.inf
            for i in range(1, len(raw)):
                best = max(raw[i - 1], best * keep)
                out[i] = best
            return out
        record = pd.Series(raw).rolling(history, min_periods=1).max().shift(1)
        return np.asarray(record.fillna(np.inf), dtype=float)

    def detect(self, values: np.ndarray, probation: int) -> SeriesResult:
        plain = self.bar == "record" and self.early_guard == 0.0 and self.remember == 1.0
        if plain:
            return super().detect(values, probation)
        raw = self.score(values, probation)
        lasting = self.sustained(raw, probation)
        history = self._history(probation)
        bars = self._bars(raw, probation)
        remembered = raw.copy()
        warm = self.warmup if self.warmup is not None else probation // 4
        suppress = self.suppress if self.suppress is not None else max(probation // 4, 1)
        quiet = self.quiet if self.quiet is not None else 4 * max(probation, 50)
        flags = np.zeros(len(raw), dtype=bool)
        last = -(10**9)
        for i in np.flatnonzero(raw > self.floor):
            if i < probation or i - last <= suppress:
                continue
            bar = bars[i]
            if self.remember < 1.0:
                bar = remembered[max(i - history, 0) : i].max() if i else np.inf
            seen = max(min(int(i) - warm, history), 1)
            bar *= (history / seen) ** self.early_guard
            strong = raw[i] > bar or lasting[i] > self.sustain_z
            if strong or (i - last > quiet and raw[i] > self.relaxed * bar):
                flags[i] = True
                last = int(i)
                span = remembered[i : i + suppress + 1]
                np.minimum(span, max(bar, self.remember * raw[i]), out=span)
        return SeriesResult(np.zeros(len(raw)), flags)


#: The variants tried, by name: each one's options for ``Designed``.
VARIANTS: Mapping[str, Mapping[str, Any]] = {
    "shipped": {},
    "likelihood": {"likelihood": "raw"},
    "likelihood_log": {"likelihood": "log"},
    "log_heavy": {"log_heavy": True},
    "predictor_8": {"predictor": 8},
    "predictor_32": {"predictor": 32},
    "tail_bar": {"bar": "tail"},
    "decaying_record": {"bar": "decay"},
    "early_guard": {"early_guard": 0.5},
    "mad_floor_5pc": {"mad_floor": 0.05},
    "remember_half": {"remember": 0.5},
    "file_range": {"file_range": True},
}
CATEGORIES = (
    "artificialNoAnomaly",
    "artificialWithAnomaly",
    "realAWSCloudwatch",
    "realAdExchange",
    "realTraffic",
    "realTweets",
)


def factory(options: Mapping[str, Any]) -> Callable[[tuple[float, ...], int], RecordDetector]:
    def make(setting: tuple[float, ...], probation: int) -> RecordDetector:
        base = SHIPPED_DETECTOR_FOR(setting[:7], probation)
        on = len(setting) < 8 or setting[7] > 0
        return Designed(base, **options) if on else Designed(base)

    return make


def screen(root: Path) -> None:
    files = list(load_corpus(root))
    short = [c.replace("artificial", "art").replace("real", "")[:10] for c in CATEGORIES]
    print(f"{'variant':<18}" + "".join(f"{c:>11}" for c in short) + "    all   FP")
    for name, options in VARIANTS.items():
        make = factory(options)
        per: dict[str, list[FileScore]] = {c: [] for c in CATEGORIES}
        for f in files:
            probation = probation_length(len(f.values))
            flags = make(SHIPPED, probation).detect(f.values, probation).flags
            per[nab_loco.category(f.name)].append(score_file(flags, f.windows, STANDARD))
        every = [s for scores in per.values() for s in scores]
        cells = "".join(f"{nab_loco._score(per[c], STANDARD):11.2f}" for c in CATEGORIES)
        total = nab_loco._score(every, STANDARD)
        print(f"{name:<18}{cells}{total:7.2f}{sum(s.fp for s in every):5d}")


def loco(root: Path, name: str) -> None:
    nab_loco.GRID = dict(nab_loco.GRID, predictor=(0.0,), variant=(0.0, 1.0))
    nab_loco.detector_for = factory(VARIANTS[name])  # type: ignore[assignment]
    start = time.perf_counter()
    result = nab_loco.leave_one_out(root)
    for h in result.held:
        on = "on" if h.setting[7] else "off"
        fp = h.false_positives
        print(f"{h.profile:<20}{h.category:<24}{h.score:8.2f}{h.htm:8.2f}{fp:5d} {on}")
    for p in PROFILES:
        print(f"{p.name:<20}mean {result.mean[p.name]:.2f}  pooled {result.pooled[p.name]:.2f}")
    print(f"{time.perf_counter() - start:.0f} s")


class FileRangeRecordFamily(RecordFamily):
    """The record detector over nab_loco's grid, handed each file's minimum and maximum
    (``Designed(file_range=True)``): the like-for-like check beside ARTime's file range."""

    name = "record_file_range"

    def flags(self, files: Sequence[NabFile], setting: tuple[float, ...]) -> list[np.ndarray]:
        if setting not in self._hits:
            hits = []
            for f in files:
                probation = probation_length(len(f.values))
                det = Designed(SHIPPED_DETECTOR_FOR(setting, probation), file_range=True)
                hits.append(np.flatnonzero(det.detect(f.values, probation).flags))
            self._hits[setting] = hits
        out = []
        for h, f in zip(self._hits[setting], files, strict=True):
            flags = np.zeros(len(f.values), dtype=bool)
            flags[h] = True
            out.append(flags)
        return out


def family_loco(root: Path, name: str) -> None:
    """A whole family through the protocol (its settings chosen on the other categories)."""
    families: dict[str, Family] = {
        "discord": DiscordFamily(),
        "discord_sustained": DiscordFamily(DISCORD_SUSTAINED_GRID),
        "discord_fusion": DiscordRecordFamily(),
        "likelihood": LikelihoodFamily(),
        "rank_mean": RankMeanFamily(),
        "likelihood_fusion": LikelihoodRecordFamily(),
        "extreme_record": ExtremeRecordFamily(),
        "artime": ArtimeFamily(),
        "artime_probation": ArtimeFamily(range_="probation"),
        "artime_running": ArtimeFamily(range_="running"),
        "artime_expanding": ArtimeFamily(range_="expanding"),
        "artime_fusion": ArtimeFusionFamily(),
        "artime_rest": ArtimeRestFamily(),
        "artime_rest_probation": ArtimeRestFamily("probation"),
        "artime_confirm": ArtimeConfirmFamily(),
        "artime_confirm_discord": ArtimeConfirmFamily(rules=DISCORD_RULES),
        "artime_discord_extreme": ArtimeExtremeFamily(),
        "artime_adaptive": ArtimeAdaptiveFamily(jump_cuts=()),
        "artime_adaptive_jump": ArtimeAdaptiveFamily(),
        "record_file_range": FileRangeRecordFamily(),
    }
    family = families[name]
    start = time.perf_counter()
    files = list(load_corpus(root))
    table = nab_loco.score_table(files, family)
    result = nab_loco.held_out(files, table)
    for h in result.held:
        setting = ",".join(f"{v:g}" for v in h.setting)
        fp = h.false_positives
        print(f"{h.profile:<20}{h.category:<24}{h.score:8.2f}{h.htm:8.2f}{fp:5d}  {setting}")
    for p in PROFILES:
        print(
            f"{p.name:<20}mean {result.mean[p.name]:.2f}  pooled {result.pooled[p.name]:.2f}"
            f"  whole corpus (best setting, not held out) {result.whole[p.name]:.2f}"
        )
    # The family's ceiling per category: its best setting chosen on that category's own
    # labels (standard profile). Not a held-out figure: what no protocol could beat.
    cats = np.array([nab_loco.category(f.name) for f in files])
    for cat in CATEGORIES:
        inside = np.flatnonzero(cats == cat)

        def on_itself(st: tuple[float, ...], inside: np.ndarray = inside) -> float:
            return nab_loco._score([table[st][STANDARD.name][i] for i in inside], STANDARD)

        best = max(table, key=on_itself)
        print(f"ceiling (chosen on its own labels) {cat:<24}{on_itself(best):8.2f}")
    if isinstance(family, ArtimeAdaptiveFamily):
        # Per standard fold, the files the chosen rule scores with its strict setting.
        for h in result.held:
            if h.profile == STANDARD.name and h.setting != family.shipped:
                kind, k, cut = h.setting[:3]
                strict = [
                    f.name.split("/")[1][:-4]
                    for f in files
                    if choose(f.values[: probation_length(len(f.values))], kind, k, cut, (1, 1))
                    == (1, 1)
                ]
                print(f"strict with {h.category} held out: {', '.join(strict)}")
    if isinstance(
        family, ArtimeFamily | ArtimeConfirmFamily | ArtimeAdaptiveFamily | ArtimeExtremeFamily
    ):
        # The published (or shipped) constants on the whole corpus, per category (a screen).
        base = family.published if isinstance(family, ArtimeFamily) else family.shipped
        for p in PROFILES:
            per = [table[base][p.name][i] for i in range(len(files))]
            cells = "  ".join(
                f"{cat} {nab_loco._score([per[i] for i in np.flatnonzero(cats == cat)], p):.2f}"
                for cat in CATEGORIES
            )
            print(f"published constants {p.name}: {cells}  all {nab_loco._score(per, p):.2f}")
    if isinstance(family, ArtimeConfirmFamily | ArtimeExtremeFamily):
        # Each rule (and margin) beside the shipped detector (threshold 0.3, rest 8),
        # whole corpus, standard profile, per category (a screen).
        extras: list[tuple[float, ...]] = (
            list(family.rules)
            if isinstance(family, ArtimeConfirmFamily)
            else [(*r, m) for r in family.confirmed.rules for m in family.margins]
        )
        for rule in extras:
            setting = (*family.shipped[:5], *rule)
            per = table[setting][STANDARD.name]
            cells = "  ".join(
                f"{nab_loco._score([per[i] for i in np.flatnonzero(cats == cat)], STANDARD):6.2f}"
                for cat in CATEGORIES
            )
            fp = sum(s.fp for s in per)
            rule_text = ",".join(f"{v:g}" for v in rule)
            whole = nab_loco._score(per, STANDARD)
            print(f"rule {rule_text:<12}{cells}  all {whole:6.2f}  FP {fp}")
    print(f"{time.perf_counter() - start:.0f} s")


#: ARTime screened with one constant changed at a time (``--artime-screen``).
ARTIME_VARIANTS: dict[str, dict[str, float]] = {
    "published": {},
    **{f"levels {v}": {"levels": v} for v in (40, 60, 100, 160)},
    **{f"windows/probation {v}": {"windows_per_probation": v} for v in (8, 10, 16, 20)},
    **{f"window {v}": {"window": v} for v in (4, 16)},
    **{f"spike_min {v}": {"spike_min": v} for v in (0.0, 0.05, 0.15, 0.2)},
    **{f"mask {v}": {"mask_factor": v} for v in (1.0, 1.25, 2.0, 3.0)},
    **{f"rho_ub_cap {v}": {"rho_ub_cap": v} for v in (0.93, 0.95, 0.99)},
}


def artime_screen(root: Path) -> None:
    """ARTime (file range, threshold 0.3, rest 8 blocks) with one constant changed at a
    time, and k-of-n votes of those runs, on the whole corpus (standard profile): a screen,
    not a held-out figure."""
    files = list(load_corpus(root))
    cats = [nab_loco.category(f.name) for f in files]
    short = [c.replace("artificial", "art").replace("real", "")[:10] for c in CATEGORIES]
    print(f"{'variant':<24}" + "".join(f"{c:>11}" for c in short) + "    all   FP")

    def row(name: str, flags: Sequence[np.ndarray]) -> None:
        every = [score_file(fl, f.windows, STANDARD) for f, fl in zip(files, flags, strict=True)]
        per = {c: [sc for sc, k in zip(every, cats, strict=True) if k == c] for c in CATEGORIES}
        cells = "".join(f"{nab_loco._score(per[c], STANDARD):11.2f}" for c in CATEGORIES)
        total = nab_loco._score(every, STANDARD)
        print(f"{name:<24}{cells}{total:7.2f}{sum(sc.fp for sc in every):5d}", flush=True)

    def rested(flags: np.ndarray, f: NabFile) -> np.ndarray:
        return rest_flags(flags, rest_rows(8.0, probation_length(len(f.values))))

    runs: dict[str, list[np.ndarray]] = {}
    for name, changes in ARTIME_VARIANTS.items():
        cfg = replace(ArtimeConfig(), **changes)
        runs[name] = [
            artime_scores(f.values, float(f.values.min()), float(f.values.max()), cfg) >= 0.3
            for f in files
        ]
        row(name, [rested(fl, f) for fl, f in zip(runs[name], files, strict=True)])
    # Votes: a row is flagged when at least k runs flagged within the last ``span`` rows
    # (its first such row), then rested.
    for frac in (0.05, 0.1, 0.25):
        for k in (2, 3, 4, 6):
            flags = []
            for i, f in enumerate(files):
                span = max(1, int(frac * probation_length(len(f.values))))
                count = np.zeros(len(f.values))
                for run in runs.values():
                    c = np.cumsum(run[i])
                    count += (c - np.concatenate([np.zeros(span), c[:-span]])) > 0
                hit = count >= k
                flags.append(rested(hit & ~np.concatenate([[False], hit[:-1]]), f))
            row(f"vote {k} of {len(runs)}, {frac} pb", flags)


def missed_windows(root: Path) -> None:
    """The AWS CloudWatch windows the record detector misses (shipped constants, 32-point
    predictor): the values at the window's centre beside the file's history before it, and
    how high each score ranks there: its largest value in the window against the 99th
    percentile of its values between the probation and the window."""
    from detectors.eval.nab_likelihood import bounded_surprise, likelihood_z

    def stats(a: np.ndarray) -> str:
        return f"median {np.median(a):.4g} sd {a.std():.4g} min {a.min():.4g} max {a.max():.4g}"

    for f in load_corpus(root):
        if nab_loco.category(f.name) != "realAWSCloudwatch":
            continue
        x, probation = f.values, probation_length(len(f.values))
        flags = RecordDetector(predictor=32).detect(x, probation).flags
        raw = bounded_surprise(x, probation, 32, 0.8, 6.0)
        scores = {
            "record": RecordDetector(predictor=32).score(x, probation),
            "likelihood z (short 10)": likelihood_z(raw, 10, None, 0.05),
            "likelihood z (short 1)": likelihood_z(raw, 1, None, 0.05),
            "discord (m 8)": discord_scores(x, probation, 8),
        }
        for k, (left, right) in enumerate(f.windows):
            if right < probation or flags[left : right + 1].any():
                continue
            centre = (left + right) // 2
            print(f"{f.name} window {k} rows {left}-{right}")
            print(f"  history before it: {stats(x[:left])}")
            print(f"  last 300 before:   {stats(x[max(left - 300, 0) : left])}")
            print(f"  window:            {stats(x[left : right + 1])}")
            near = np.array2string(x[centre - 8 : centre + 9], precision=4, max_line_width=160)
            print(f"  centre +-8 rows: {near}")
            for name, sc in scores.items():
                past = sc[probation:left]
                p99 = float(np.quantile(past, 0.99)) if len(past) else float("nan")
                top = sc[left : right + 1].max()
                print(f"  {name:<24} in window {top:8.2f}  p99 before {p99:8.2f}")


def artime_detections(root: Path) -> None:
    """Every detection of ``eagleeye eval nab``'s default ARTime after the probation on AWS
    CloudWatch and ad exchange: file, row, score, true or false positive (with the false
    positive's cost factor) and the confirmation's evidence (nab_artime_confirm)."""
    from detectors.eval.nab import _false_positive_cost
    from detectors.eval.nab_detectors import artime_flags

    for f in load_corpus(root):
        if nab_loco.category(f.name) not in ("realAWSCloudwatch", "realAdExchange"):
            continue
        x, probation = f.values, probation_length(len(f.values))
        low, high = float(x.min()), float(x.max())
        scores = artime_scores(x, low, high, probation=probation)
        for row in np.flatnonzero(artime_flags(x, probation, low, high)):
            if row < probation:
                continue
            cost = _false_positive_cost(int(row), f.windows)
            verdict = "TP" if cost is None else f"FP {cost:+.2f}"
            outside, spread = evidence(x, int(row), probation, low, high)
            print(
                f"{f.name:<56}{row:6d}  {verdict:<9} score {scores[row]:.3f}  "
                f"outside {outside:.3f}  spread {spread:.2f}"
            )


def zero_fp_bound(root: Path) -> None:
    """Per category, standard profile: the detectors' flags, and the same with every flag
    outside a window removed."""
    per: dict[str, dict[str, list[FileScore]]] = {}
    for f in load_corpus(root):
        probation = probation_length(len(f.values))
        inside = np.zeros(len(f.values), dtype=bool)
        for left, right in f.windows:
            inside[left : right + 1] = True
        record = RecordDetector(predictor=32).detect(f.values, probation).flags
        scores = discord_scores(f.values, probation, 8)
        discord = record_flags(scores, probation, 1.0, 4 * max(probation, 50), 0.5)
        rows = per.setdefault(nab_loco.category(f.name), {})
        for name, flags in (
            ("record", record),
            ("record, no FP", record & inside),
            ("record or discord, no FP", (record | discord) & inside),
        ):
            rows.setdefault(name, []).append(score_file(flags, f.windows, STANDARD))
    for cat, rows in per.items():
        if sum(s.windows for s in rows["record"]):
            cells = "  ".join(f"{k} {nab_loco._score(v, STANDARD):6.2f}" for k, v in rows.items())
            print(f"{cat:<24}{cells}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("..") / "shared" / "data" / "nab")
    parser.add_argument("--loco", choices=sorted(VARIANTS), default=None)
    parser.add_argument(
        "--family",
        choices=(
            "discord",
            "discord_sustained",
            "discord_fusion",
            "likelihood",
            "rank_mean",
            "likelihood_fusion",
            "extreme_record",
            "artime",
            "artime_probation",
            "artime_running",
            "artime_expanding",
            "artime_fusion",
            "artime_rest",
            "artime_rest_probation",
            "artime_confirm",
            "artime_confirm_discord",
            "artime_discord_extreme",
            "artime_adaptive",
            "artime_adaptive_jump",
            "record_file_range",
        ),
        default=None,
    )
    parser.add_argument("--zero-fp-bound", action="store_true")
    parser.add_argument("--missed", action="store_true")
    parser.add_argument("--artime-screen", action="store_true")
    parser.add_argument("--artime-detections", action="store_true")
    args = parser.parse_args()
    if args.artime_detections:
        artime_detections(args.root)
    elif args.artime_screen:
        artime_screen(args.root)
    elif args.missed:
        missed_windows(args.root)
    elif args.zero_fp_bound:
        zero_fp_bound(args.root)
    elif args.family:
        family_loco(args.root, args.family)
    elif args.loco:
        loco(args.root, args.loco)
    else:
        screen(args.root)


if __name__ == "__main__":
    main()
