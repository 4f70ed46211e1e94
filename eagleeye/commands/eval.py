"""`eagleeye eval`: measure the detectors on labelled data."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from eagleeye.commands._args import output_file
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
        "--generator",
        choices=("default", "fleet"),
        default="default",
        help="default: independent draws per step; fleet: an event simulation of a "
        "synchronous job and its sources, designed apart (default: default)",
    )
    g.add_argument(
        "--seeds",
        type=_range,
        default=None,
        help="seeds of faulty traces, A-B inclusive (default: 5000-5019; fleet 7000-7019)",
    )
    g.add_argument(
        "--healthy-seeds",
        type=_range,
        default=None,
        help="seeds of healthy traces (default: 6000-6001; fleet 8000-8001)",
    )
    g.add_argument("--nodes", type=int, default=8, help="nodes per faulty trace (default: 8)")
    g.add_argument("--ranks-per-node", type=int, default=8, help="(default: 8)")
    g.set_defaults(func=_generated)
    t = modes.add_parser("trace", help="one labelled trace file (labels in <stem>.labels.json)")
    t.add_argument("path", type=Path)
    t.set_defaults(func=_trace)
    n = modes.add_parser("nab", help="the NAB score of a univariate detector")
    n.add_argument(
        "--root",
        type=Path,
        default=DEFAULT_NAB,
        help=f"NAB corpus folder with windows.json and data/ (default: {DEFAULT_NAB})",
    )
    n.add_argument(
        "--detector",
        default=None,
        metavar="NAME",
        help="the detector scored: artime_discord_extreme (ARTime's detections confirmed "
        "by how rare the recent shape is for the file, joined by a new-extreme trigger; the "
        "held-out winner), artime (ARTime with a rest after each detection; both scaled by "
        "each file's minimum and maximum, as NAB's harness hands them to every detector) or "
        "record (the project's RecordDetector, which uses the probation only) "
        "(default: artime_discord_extreme)",
    )
    n.add_argument(
        "--loco",
        action="store_true",
        help="leave one category out: constants chosen on the other categories, each "
        "category scored held out, beside Numenta HTM's published score on it",
    )
    n.add_argument(
        "--family",
        choices=(
            "record",
            "cad",
            "fusion",
            "artime",
            "artime_rest",
            "artime_fusion",
            "artime_discord_extreme",
        ),
        default="record",
        help="with --loco: the detector family whose constants are chosen: the record "
        "detector, CAD OSE, both joined by a rule the protocol chooses (fusion), ARTime "
        "(file range), ARTime with a rest after each detection kept (artime_rest), "
        "ARTime joined with the record detector and the new-extreme trigger by a rule the "
        "protocol chooses (artime_fusion), or ARTime with a rest, a discord confirmation "
        "and the new-extreme trigger (artime_discord_extreme) (default: record)",
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
    w.add_argument("--generator", choices=("default", "fleet"), default="default")
    w.add_argument("--steps", type=int, default=400, help="length of a healthy trace")
    w.set_defaults(func=_generate)
    c = modes.add_parser(
        "cross",
        help="cross-generator check: constants chosen on one generator, scored on the other",
        description=(
            "Chooses the detectors' tunable constants on the tuning seeds of one trace "
            "generator and scores the choice on the report seeds of the other, both ways "
            "(docs/detectors.md, 'Choosing constants')."
        ),
    )
    c.add_argument("--quick", action="store_true", help="a few seeds only (a smoke run)")
    c.add_argument(
        "--tuned-on",
        choices=("default", "fleet", "both"),
        default="both",
        help="the direction(s) run: the generator the constants are chosen on (default: both)",
    )
    for gen in ("default", "fleet"):
        c.add_argument(
            f"--{gen}-seeds",
            type=_range,
            default=None,
            help=f"report seeds of faulty {gen} traces, A-B (fresh seeds for an unseen figure)",
        )
        c.add_argument(
            f"--{gen}-healthy-seeds",
            type=_range,
            default=None,
            help=f"report seeds of healthy {gen} traces, A-B",
        )
    c.set_defaults(func=_cross)
    x = modes.add_parser(
        "export",
        help="write a recorded run as a labelled trace (labels from its injected faults)",
        description=(
            "Exports a run folder (runs/<id>/) to the labelled trace format: rows to OUT "
            "(.csv or .parquet), fault windows to <stem>.labels.json beside it."
        ),
    )
    x.add_argument("run", type=Path, metavar="RUN_DIR", help="a run folder under runs/")
    x.add_argument(
        "out", type=output_file, metavar="OUT", help="trace file to write (.csv, .parquet)"
    )
    x.set_defaults(func=_export)
    for q in (g, t, n, c):
        q.add_argument("--json", type=Path, default=None, help="also write results as JSON")
    for q in (g, t):
        q.add_argument("--config", type=Path, default=None, help="detector config TOML")
    t.add_argument(
        "--live",
        action="store_true",
        help="score the detector set of live runs (hard rules plus the fused detectors of "
        "`eagleeye run`) instead of the trace defaults; for traces exported from runs",
    )
    t.add_argument(
        "--hosts",
        action="store_true",
        help="score the path of `eagleeye controller` with agents: each node a host whose "
        "agent summarises its ranks' steps and judges their full series, the controller "
        "judging the summaries and the hosts' medians (ranks 0..N-1 in equal blocks per node)",
    )


def _range(text: str) -> range:
    lo, _, hi = text.partition("-")
    try:
        return range(int(lo), int(hi or lo) + 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N or A-B, got {text!r}") from None


def _emit(result: dict[str, Any], args: argparse.Namespace) -> None:
    """Writes the report as strict JSON: a figure that has no value (a recall without a
    window, a delay without a detection) is null, not NaN."""
    if args.json:
        args.json.write_text(json.dumps(_strict(result), indent=1, allow_nan=False))


def _strict(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_strict(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _generated(args: argparse.Namespace) -> int:
    from detectors.config import load_config
    from detectors.eval.harness import (
        REPORT_SEEDS,
        GeneratedEval,
        evaluate_generated,
        print_report,
    )

    seeds, healthy = REPORT_SEEDS[args.generator]
    spec = GeneratedEval(
        args.nodes,
        args.ranks_per_node,
        tuple(args.seeds if args.seeds is not None else seeds),
        tuple(args.healthy_seeds if args.healthy_seeds is not None else healthy),
        generator=args.generator,
    )
    result = evaluate_generated(spec, load_config(args.config))
    print_report(result, sys.stdout)
    _emit(result, args)
    return 0


def _trace(args: argparse.Namespace) -> int:
    from detectors.config import load_config
    from detectors.eval.harness import evaluate_trace_file, print_report

    if sum((args.live, args.hosts, args.config is not None)) > 1:
        raise EagleEyeError("--live, --hosts and --config each choose the detectors; give one")
    config = load_config(args.config)
    if args.live:
        from eagleeye.detection import replay_config

        config = replay_config()
    if args.hosts:
        from eagleeye.agents.replay import run_trace_across_hosts

        result = evaluate_trace_file(args.path, runner=run_trace_across_hosts)
    else:
        result = evaluate_trace_file(args.path, config)
    print_report(result, sys.stdout)
    _emit(result, args)
    return 0


def _cross(args: argparse.Namespace) -> int:
    from detectors.eval.harness import REPORT_SEEDS, print_report
    from detectors.eval.protocol import cross

    seeds = {
        gen: (
            getattr(args, f"{gen}_seeds") or REPORT_SEEDS[gen][0],
            getattr(args, f"{gen}_healthy_seeds") or REPORT_SEEDS[gen][1],
        )
        for gen in REPORT_SEEDS
    }
    tuned_on = ("default", "fleet") if args.tuned_on == "both" else (args.tuned_on,)
    result = cross(quick=args.quick, report_seeds=seeds, tuned_on=tuned_on)
    for name, part in result.items():
        print(f"== {name}, reported on {part['reported_on']}")
        for key, value in part["setting"].items():
            print(f"   {key} = {value:g}")
        print_report(part["report"], sys.stdout)
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


def _loco(args: argparse.Namespace) -> int:
    from detectors.eval.nab_artime import ArtimeFamily
    from detectors.eval.nab_artime_extreme import ArtimeExtremeFamily
    from detectors.eval.nab_artime_fusion import ArtimeFusionFamily
    from detectors.eval.nab_artime_rest import ArtimeRestFamily
    from detectors.eval.nab_families import CadFamily, Family, FusionFamily, RecordFamily
    from detectors.eval.nab_loco import leave_one_out

    if args.detector is not None:
        raise EagleEyeError("--detector scores one detector; with --loco give --family instead")
    families: dict[str, type[Family]] = {
        "record": RecordFamily,
        "cad": CadFamily,
        "fusion": FusionFamily,
        "artime": ArtimeFamily,
        "artime_rest": ArtimeRestFamily,
        "artime_fusion": ArtimeFusionFamily,
        "artime_discord_extreme": ArtimeExtremeFamily,
    }
    result = leave_one_out(args.root, families[args.family]())
    print(f"{'profile':<20}{'held-out category':<24}{'score':>8}{'HTM':>8}{'FP':>5}")
    for h in result.held:
        print(f"{h.profile:<20}{h.category:<24}{h.score:8.2f}{h.htm:8.2f}{h.false_positives:5d}")
    for name in result.mean:
        print(
            f"{name:<20}mean {result.mean[name]:.2f}  pooled {result.pooled[name]:.2f}  "
            f"whole corpus (best setting, not held out) {result.whole[name]:.2f}"
        )
    _emit(
        {
            "family": args.family,
            "held": [h.__dict__ for h in result.held],
            "mean": dict(result.mean),
            "pooled": dict(result.pooled),
            "whole": dict(result.whole),
        },
        args,
    )
    return 0


def _nab(args: argparse.Namespace) -> int:
    from detectors.eval.nab_detectors import DEFAULT_DETECTOR, DETECTORS
    from detectors.eval.nab_eval import evaluate_nab

    if args.loco:
        return _loco(args)

    name = args.detector or DEFAULT_DETECTOR
    if name not in DETECTORS:
        raise EagleEyeError(
            f"--detector {name!r} is not a NAB detector: choose one of {', '.join(DETECTORS)}"
        )
    result = evaluate_nab(
        args.root, probation_cap=None if args.uncapped_probation else 5000, name=name
    )
    print(f"detector {result.detector}")
    for name, score in result.scores.items():
        print(f"{name:<22}{score:8.2f}")
    print(
        f"files {result.files}, windows {result.windows}: detected {result.tp}, "
        f"missed {result.fn}, false positives {result.fp} (standard profile)"
    )
    _emit(
        {
            "detector": result.detector,
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
    from detectors.eval.generators import Shape, make_trace
    from detectors.eval.trace import write_trace

    shape = Shape(args.nodes, args.ranks_per_node, args.seed, args.healthy, args.steps)
    trace = make_trace(args.generator, shape)
    write_trace(trace, args.path)
    print(f"wrote {args.path} ({len(trace.steps)} observations, {len(trace.labels)} faults)")
    return 0
