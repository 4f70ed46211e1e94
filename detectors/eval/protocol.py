"""Cross-generator validation: choose the constants on one generator, report on the other.

The constants of ``GRID`` (the ones a change of noise or layout would move) are chosen on
the tuning seeds of one generator by a coordinate search from the shipped defaults: for
each constant in turn, every value of its row is tried with the others as chosen so far,
and the best by ``objective`` is kept (the current value on a tie). The setting chosen is
then scored on the report seeds of the *other* generator, which no choice saw. Both
directions are run. The shipped defaults are the setting chosen on ``default``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from detectors.config import DetectorsConfig, DetectorSpec
from detectors.eval.generators import Shape, make_trace
from detectors.eval.harness import REPORT_SEEDS, GeneratedEval, evaluate_generated, report
from detectors.eval.metrics import score_trace
from detectors.eval.runner import run_trace

Key = tuple[str, str]  # (detector, parameter)
#: The constants chosen by the protocol and the values tried (the default among them).
GRID: Mapping[Key, tuple[float, ...]] = {
    ("peer_outlier", "z"): (4.5, 6.0, 8.0),
    ("peer_outlier", "min_shift"): (0.04, 0.06, 0.09),
    ("trend", "z"): (4.0, 6.0, 9.0),
    ("collective_hang", "min_silence_s"): (5.0, 15.0, 40.0),
    ("throughput_change", "h"): (0.4, 1.0, 2.5),
}
#: Seeds each generator lends to tuning (the report seeds are in REPORT_SEEDS).
TUNE_SEEDS: Mapping[str, range] = {"default": range(0, 10), "fleet": range(100, 110)}
HEALTHY_TUNE = Shape(16, 8, 9000, healthy=True, steps=1000)


def config_with(
    setting: Mapping[Key, float], base: DetectorsConfig | None = None
) -> DetectorsConfig:
    """The base config (the defaults) with the setting's parameters over it."""
    base = base or DetectorsConfig()
    specs = []
    for spec in base.specs:
        params = dict(spec.params)
        params.update({p: v for (d, p), v in setting.items() if d == spec.name})
        specs.append(DetectorSpec(spec.name, params))
    return replace(base, specs=tuple(specs))


def defaults(base: DetectorsConfig | None = None) -> dict[Key, float]:
    """The value each grid constant has in the base config (or the detector's default)."""
    from detectors.registry import create

    base = base or DetectorsConfig()
    out = {}
    for detector, param in GRID:
        spec = next(s for s in base.specs if s.name == detector)
        built = create(detector, spec.params)
        out[(detector, param)] = float(spec.params.get(param, _attr(built, param)))
    return out


def _attr(detector: Any, param: str) -> float:
    for holder in (detector, getattr(detector, "core", None)):
        if holder is not None and hasattr(holder, param):
            return float(getattr(holder, param))
    raise KeyError(f"{type(detector).__name__} has no parameter {param!r}")


def objective(result: Mapping[str, Any]) -> tuple[float, ...]:
    """Larger is better: the worst class's F1, localisation, macro F1, fewer false alarms,
    then faster detection of slow faults."""
    s = result["summary"]
    alarms = s["false_alarms_per_node_day"]
    return (
        round(s["min_class_f1"], 4),
        round(s["localisation"], 4),
        round(s["macro_f1"], 4),
        -round(alarms if alarms == alarms else 0.0, 3),
        -round(s["median_delay_failslow_steps"], 2),
    )


def score(generator: str, seeds: Sequence[int], config: DetectorsConfig) -> dict[str, Any]:
    """The report of the config on a generator's tuning seeds and one healthy trace."""
    faulty = [make_trace(generator, Shape(8, 8, s)) for s in seeds]
    healthy = [make_trace(generator, HEALTHY_TUNE)]
    return report(
        [score_trace(t, run_trace(t, config)) for t in faulty],
        [score_trace(t, run_trace(t, config)) for t in healthy],
    )


Trail = list[tuple[dict[Key, float], tuple[float, ...]]]


def tune(generator: str, seeds: Sequence[int] | None = None) -> tuple[dict[Key, float], Trail]:
    """The setting chosen on a generator by the coordinate search, and its trail."""
    seeds = TUNE_SEEDS[generator] if seeds is None else seeds
    chosen = defaults()
    best = objective(score(generator, seeds, config_with(chosen)))
    trail: Trail = [(dict(chosen), best)]
    for key, values in GRID.items():
        for value in values:
            if value == chosen[key]:
                continue
            trial = {**chosen, key: value}
            got = objective(score(generator, seeds, config_with(trial)))
            trail.append((trial, got))
            if got > best:
                best, chosen = got, trial
    return chosen, trail


def cross(
    quick: bool = False,
    report_seeds: Mapping[str, tuple[range, range]] | None = None,
    tuned_on: Sequence[str] = ("default", "fleet"),
) -> dict[str, Any]:
    """Both directions: tuned on one generator, reported on the other's report seeds.

    ``report_seeds`` replaces a generator's (faulty, healthy) report seeds (fresh seeds
    for a figure no change has seen); ``tuned_on`` names the directions run.
    """
    out: dict[str, Any] = {}
    chosen = {**REPORT_SEEDS, **(report_seeds or {})}
    for source in tuned_on:
        if source not in TUNE_SEEDS:
            raise ValueError(f"no generator {source!r}: tune on one of {', '.join(TUNE_SEEDS)}")
    directions = [(a, b) for a, b in (("default", "fleet"), ("fleet", "default")) if a in tuned_on]
    for tuned_on_, reported_on in directions:
        tune_seeds = list(TUNE_SEEDS[tuned_on_])[: 3 if quick else None]
        setting, trail = tune(tuned_on_, tune_seeds)
        seeds, healthy = chosen[reported_on]
        spec = GeneratedEval(
            seeds=tuple(seeds)[: 4 if quick else None],
            healthy_seeds=tuple(healthy)[: 1 if quick else None],
            generator=reported_on,
        )
        out[f"tuned_on_{tuned_on_}"] = {
            "setting": {f"{d}.{p}": v for (d, p), v in setting.items()},
            "tuning_trail": [
                ({f"{d}.{p}": v for (d, p), v in s.items()}, list(o)) for s, o in trail
            ],
            "reported_on": reported_on,
            "report": evaluate_generated(spec, config_with(setting)),
        }
    return out
