"""`eagleeye eval`: measure the detectors on labelled data."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from eagleeye.errors import EagleEyeError

DEFAULT_NAB = Path("..") / "shared" / "data" / "nab"


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "eval",
        help="measure the detectors: generated fault traces, a labelled trace, or NAB",
        description="Scores the detectors on labelled data and prints the results.",
    )
    modes = p.add_subparsers(dest="mode", metavar="MODE", required=True)
    g = modes.add_parser("generated", help="fault-injected traces of every class + healthy ones")
    g.add_argument(
        "--seeds",
        type=_range,
        default=range(5000, 5020),
        help="seeds of faulty traces, A-B inclusive (default: 5000-5019)",
    )
    g.add_argument(
        "--healthy-seeds",
        type=_range,
        default=range(6000, 6002),
        help="seeds of healthy traces (default: 6000-6001)",
    )
    g.add_argument("--nodes", type=int, default=8, help="nodes per faulty trace (default: 8)")
    g.add_argument("--ranks-per-node", type=int, default=8, help="(default: 8)")
    g.set_defaults(func=_generated)
    t = modes.add_parser("trace", help="one labelled trace file (labels in <stem>.labels.json)")
    t.add_argument("path", type=Path)
    t.set_defaults(func=_trace)
    n = modes.add_parser("nab", help="the NAB score of the univariate detector")
    n.add_argument(
        "--root",
        type=Path,
        default=DEFAULT_NAB,
        help=f"NAB corpus folder with windows.json and data/ (default: {DEFAULT_NAB})",
    )
    n.add_argument(
        "--uncapped-probation",
        action="store_true",
        help="probation = 15%% of every file, without NAB's 750-row cap",
    )
    n.set_defaults(func=_nab)
    w = modes.add_parser("generate", help="write a generated labelled trace (CSV or Parquet)")
    w.add_argument("path", type=Path)
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--nodes", type=int, default=4)
    w.add_argument("--ranks-per-node", type=int, default=4)
    w.add_argument("--healthy", action="store_true", help="inject no fault")
    w.add_argument("--steps", type=int, default=400, help="length of a healthy trace")
    w.set_defaults(func=_generate)
    x = modes.add_parser(
        "export",
        help="write a recorded run as a labelled trace (labels from its injected faults)",
        description=(
            "Exports a run folder (runs/<id>/) to the labelled trace format: rows to OUT "
            "(.csv or .parquet), fault windows to <stem>.labels.json beside it."
        ),
    )
    x.add_argument("run", type=Path, metavar="RUN_DIR", help="a run folder under runs/")
    x.add_argument("out", type=Path, metavar="OUT", help="trace file to write (.csv, .parquet)")
    x.set_defaults(func=_export)
    for q in (g, t, n):
        q.add_argument("--json", type=Path, default=None, help="also write results as JSON")
    for q in (g, t):
        q.add_argument("--config", type=Path, default=None, help="detector config TOML")
    t.add_argument(
        "--live",
        action="store_true",
        help="score the detector set of live runs (hard rules plus the fused detectors of "
        "`eagleeye run`) instead of the trace defaults; for traces exported from runs",
    )


def _range(text: str) -> range:
    lo, _, hi = text.partition("-")
    try:
        return range(int(lo), int(hi or lo) + 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N or A-B, got {text!r}") from None


def _emit(result: dict[str, Any], args: argparse.Namespace) -> None:
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


def _generated(args: argparse.Namespace) -> int:
    from detectors.config import load_config
    from detectors.eval.harness import GeneratedEval, evaluate_generated, print_report

    spec = GeneratedEval(
        args.nodes, args.ranks_per_node, tuple(args.seeds), tuple(args.healthy_seeds)
    )
    result = evaluate_generated(spec, load_config(args.config))
    print_report(result, sys.stdout)
    _emit(result, args)
    return 0


def _trace(args: argparse.Namespace) -> int:
    from detectors.config import load_config
    from detectors.eval.harness import evaluate_trace_file, print_report

    if args.live and args.config:
        raise EagleEyeError("--live and --config both choose the detectors; give one")
    config = load_config(args.config)
    if args.live:
        from eagleeye.detection import replay_config

        config = replay_config()
    result = evaluate_trace_file(args.path, config)
    print_report(result, sys.stdout)
    _emit(result, args)
    return 0


def _export(args: argparse.Namespace) -> int:
    from detectors.eval.trace import write_trace
    from eagleeye.recorded import recorded_trace

    if args.out.suffix not in (".csv", ".parquet"):
        raise EagleEyeError(f"OUT must end in .csv or .parquet, got {args.out}")
    trace = recorded_trace(args.run)
    write_trace(trace, args.out)
    print(
        f"wrote {args.out} ({len(trace.steps)} observations of {len(trace.ranks)} ranks, "
        f"{len(trace.labels)} fault windows)"
    )
    return 0


def _nab(args: argparse.Namespace) -> int:
    from detectors.eval.nab_eval import evaluate_nab

    result = evaluate_nab(args.root, probation_cap=None if args.uncapped_probation else 5000)
    for name, score in result.scores.items():
        print(f"{name:<22}{score:8.2f}")
    print(
        f"files {result.files}, windows {result.windows}: detected {result.tp}, "
        f"missed {result.fn}, false positives {result.fp} (standard profile)"
    )
    _emit(
        {
            "scores": result.scores,
            "files": result.files,
            "windows": result.windows,
            "tp": result.tp,
            "fp": result.fp,
            "fn": result.fn,
        },
        args,
    )
    return 0


def _generate(args: argparse.Namespace) -> int:
    from detectors.eval.generate import FAULT_KINDS, TraceSpec, generate
    from detectors.eval.trace import write_trace

    spec = TraceSpec(
        args.nodes,
        args.ranks_per_node,
        faults=() if args.healthy else FAULT_KINDS,
        steps=args.steps,
        seed=args.seed,
    )
    trace = generate(spec)
    write_trace(trace, args.path)
    print(f"wrote {args.path} ({len(trace.steps)} observations, {len(trace.labels)} faults)")
    return 0
