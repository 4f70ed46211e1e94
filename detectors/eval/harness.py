"""The evaluation harness behind ``eagleeye eval`` and ``eagleeye detect``."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import pandas as pd

from detectors.config import DetectorsConfig
from detectors.errors import DetectorError
from detectors.eval.generators import Shape, make_trace
from detectors.eval.metrics import TraceResult, class_scores, score_trace, summary
from detectors.eval.nab import probation_length
from detectors.eval.nab_corpus import read_series
from detectors.eval.nab_detectors import DEFAULT_DETECTOR, series_verdict
from detectors.eval.runner import Emitted, run_trace
from detectors.eval.trace import Trace, labels_path, read_trace

#: Seeds the reported figures use, per generator: faulty and healthy. Development looked
#: at others only (docs/detectors.md, "Evaluation").
REPORT_SEEDS: dict[str, tuple[range, range]] = {
    "default": (range(5000, 5020), range(6000, 6002)),
    "fleet": (range(7000, 7020), range(8000, 8002)),
}


@dataclass(frozen=True)
class GeneratedEval:
    """What ``eagleeye eval generated`` measures."""

    nodes: int = 8
    ranks_per_node: int = 8
    seeds: Sequence[int] = tuple(REPORT_SEEDS["default"][0])
    healthy_seeds: Sequence[int] = tuple(REPORT_SEEDS["default"][1])
    healthy_nodes: int = 32
    healthy_steps: int = 2000
    generator: str = "default"


def evaluate_generated(
    spec: GeneratedEval, config: DetectorsConfig | None = None
) -> dict[str, Any]:
    """Generates faulty and healthy traces, runs the detectors and scores them."""
    gen, n, k = spec.generator, spec.nodes, spec.ranks_per_node
    faulty = [_score(make_trace(gen, Shape(n, k, s)), config) for s in spec.seeds]
    healthy = [
        _score(make_trace(gen, Shape(spec.healthy_nodes, k, s, True, spec.healthy_steps)), config)
        for s in spec.healthy_seeds
    ]
    return report(faulty, healthy)


def _score(trace: Any, config: DetectorsConfig | None) -> TraceResult:
    return score_trace(trace, run_trace(trace, config))


#: Runs a trace through some path to the findings it would draw (``run_trace`` with a
#: config, or another deployment's path, such as the one across hosts).
TraceRunner = Callable[[Trace], list[Emitted]]


def report(faulty: Sequence[TraceResult], healthy: Sequence[TraceResult]) -> dict[str, Any]:
    """Per-class and headline numbers as plain data (JSON-ready)."""
    classes = {
        c.kind: {
            "windows": c.windows,
            "detected": c.detected,
            "findings": c.findings,
            "precision": c.precision,
            "recall": c.recall,
            "f1": c.f1,
            "localisation": c.localisation,
            "delay_steps": c.delay_steps,
            "delay_s": c.delay_s,
        }
        for c in class_scores(faulty)
    }
    return {
        "classes": classes,
        "summary": summary(faulty, healthy),
        "traces": len(faulty),
        "healthy_traces": len(healthy),
    }


def evaluate_trace_file(
    path: Path, config: DetectorsConfig | None = None, runner: TraceRunner | None = None
) -> dict[str, Any]:
    """Scores the detectors (``config``, or what ``runner`` runs) on one labelled trace
    file. A trace labelled with no window (``[]``) is a healthy one: its findings are false
    alarms per node-day.

    Raises:
        DetectorError: the trace has no labels file beside it (scoring needs one).
    """
    trace = read_trace(path)  # what is wrong with the rows is said first
    labels = labels_path(path)
    if not labels.is_file():
        raise DetectorError(
            f"{path} has no labels: {labels} not found. Write its fault windows there "
            "([] for a healthy trace; docs/trace-format.md), or run "
            f"`eagleeye detect {path}` for its findings alone"
        )
    emitted = runner(trace) if runner is not None else run_trace(trace, config)
    result = score_trace(trace, emitted)
    return report([], [result]) if not trace.labels else report([result], [])


def print_report(result: dict[str, Any], out: TextIO) -> None:
    """A short human-readable table of a report."""
    out.write(
        f"{'class':<18}{'windows':>8}{'found':>7}{'prec':>7}{'recall':>8}{'F1':>7}"
        f"{'local':>7}{'delay':>7}{'delay s':>9}\n"
    )
    for kind, c in result["classes"].items():
        out.write(
            f"{kind:<18}{c['windows']:>8}{c['detected']:>7}{c['precision']:>7.3f}"
            f"{c['recall']:>8.3f}{c['f1']:>7.3f}{c['localisation']:>7.3f}"
            f"{c['delay_steps']:>7.1f}{c['delay_s']:>9.1f}\n"
        )
    for key, value in result["summary"].items():
        out.write(f"{key:<30}{value:>12.4f}\n")


def detect_trace(
    path: Path,
    config: DetectorsConfig | None = None,
    scorers: Sequence[Any] = (),
    scores: Path | None = None,
) -> list[Emitted]:
    """Runs the configured detectors over a recorded trace file, with fitted learned
    scorers added when given (``scores``: a CSV of every vector they scored)."""
    trace = read_trace(path)
    if not scorers:
        return run_trace(trace, config)
    from detectors.eval.learning import run_with

    return run_with(trace, config or DetectorsConfig(), scorers, scores)


def write_findings(emitted: Iterable[Emitted], out: TextIO) -> int:
    """Writes one JSON finding per line; returns how many."""
    count = 0
    for e in emitted:
        out.write(json.dumps(e.finding.to_json(), allow_nan=False) + "\n")
        count += 1
    return count


def is_series_file(path: Path) -> bool:
    """Whether a CSV is NAB-style (``timestamp,value`` header) rather than a trace."""
    if path.suffix != ".csv" or not path.is_file():
        return False
    with path.open("rb") as f:  # any bytes: the reader names what is wrong with them
        header = f.readline(4096).decode("utf-8", "replace").strip().split(",")
    return header[:2] == ["timestamp", "value"]


def detect_series(path: Path, detector: str = DEFAULT_DETECTOR) -> pd.DataFrame:
    """Scores a NAB-style file: ``timestamp,value,anomaly_score,is_anomaly`` per row.

    ``detector`` names one of detectors/eval/nab_detectors.py (the default is the one
    ``eagleeye eval nab`` scores). It is given what NAB's harness gives a detector (the
    probation, NAB's 15 % of the rows at most 750, and the file's minimum and maximum)
    and chooses its own threshold.
    """
    timestamps, values = read_series(path)
    try:
        verdict = series_verdict(detector, values, probation_length(len(values)))
    except DetectorError as e:
        shorter = len(values) > 0 and detector != "record"  # the record detector scores any
        hint = "; the record detector (`--detector record`) scores it" if shorter else ""
        raise DetectorError(f"{path}: {e}{hint}") from None
    return pd.DataFrame(
        {
            "timestamp": timestamps,
            "value": values,
            "anomaly_score": verdict.scores,
            "is_anomaly": verdict.flags.astype(int),
        }
    )
