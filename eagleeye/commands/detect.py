"""`eagleeye detect`: run the configured detectors over a recorded trace or a series."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from eagleeye.commands._args import output_file
from eagleeye.errors import EagleEyeError


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "detect",
        help="run the detectors over a recorded trace (or a NAB-style timestamp,value CSV)",
        description=(
            "Runs the configured detectors over INPUT. A trace (long CSV or Parquet with "
            "columns time,step,job,replica,node,rank,metric,value) gives one JSON finding per "
            "line. A NAB-style CSV (timestamp,value) gives timestamp,value,anomaly_score,"
            "is_anomaly per row, with the threshold chosen by the detector itself."
        ),
    )
    p.add_argument("input", type=Path, metavar="INPUT", help="trace or timestamp,value CSV")
    p.add_argument(
        "--output",
        "-o",
        type=output_file,
        default=None,
        help="where to write (default: standard output)",
    )
    p.add_argument(
        "--config",
        type=Path,
        default=None,
        help="detector config TOML (default: $EAGLEEYE_DETECTORS_CONFIG or built-in)",
    )
    p.add_argument(
        "--detector",
        choices=("artime_discord_extreme", "artime", "record"),
        default=None,
        help="for a timestamp,value series: ARTime confirmed by a discord rule and joined by "
        "a new-extreme trigger (artime_discord_extreme, the detector `eagleeye eval nab` "
        "scores), ARTime with a rest after each detection (artime) or the RecordDetector "
        "(record) (default: artime_discord_extreme)",
    )
    p.add_argument(
        "--live",
        action="store_true",
        help="the detector set of live runs (for traces exported with `eagleeye eval export`)",
    )
    learned = p.add_argument_group("learned scorers (multivariate, per rank)")
    learned.add_argument(
        "--fit",
        type=Path,
        metavar="HEALTHY",
        default=None,
        help="fit the learned scorers on a healthy trace, then score INPUT with them",
    )
    learned.add_argument(
        "--model", type=Path, default=None, help="score with the scorers of a saved model file"
    )
    learned.add_argument(
        "--save-model",
        type=output_file,
        default=None,
        help="write the scorers fitted by --fit (.npz)",
    )
    learned.add_argument(
        "--learned",
        default="pca,isolation_forest,autoencoder,lstm_vae",
        help="the scorers --fit fits (default: pca,isolation_forest,autoencoder,lstm_vae)",
    )
    learned.add_argument(
        "--refit",
        type=int,
        default=0,
        metavar="N",
        help="refit a fitted scorer every N vectors it did not flag (default 0: frozen)",
    )
    learned.add_argument(
        "--scores",
        type=output_file,
        default=None,
        help="write every scored vector (step,time,rank,scorer,score,threshold) as CSV",
    )
    p.set_defaults(func=_detect)


def _learned(args: argparse.Namespace) -> list:  # type: ignore[type-arg]
    """The learned scorers asked for: fitted on --fit, or loaded from --model."""
    from detectors.eval.learning import fit_scorers
    from detectors.modelfile import load_models, save_models

    if args.fit and args.model:
        raise EagleEyeError("--fit and --model both give the learned scorers; give one")
    if args.save_model and not args.fit:
        raise EagleEyeError("--save-model writes what --fit fitted: give --fit HEALTHY")
    if args.model:
        return load_models(args.model, refit_every=args.refit)
    if not args.fit:
        if args.scores:
            raise EagleEyeError(
                "--scores writes the learned scorers' scores: give --fit or --model"
            )
        return []
    names = [n.strip() for n in args.learned.split(",") if n.strip()]
    scorers = fit_scorers(args.fit, names, refit_every=args.refit)
    if args.save_model:
        save_models(args.save_model, scorers)
        print(f"saved {len(scorers)} fitted scorers to {args.save_model}", file=sys.stderr)
    return scorers


def _detect(args: argparse.Namespace) -> int:
    from detectors.config import load_config
    from detectors.eval.harness import detect_series, detect_trace, is_series_file, write_findings
    from detectors.eval.nab_detectors import DEFAULT_DETECTOR

    out = args.output.open("w") if args.output else sys.stdout
    try:
        if is_series_file(args.input):
            frame = detect_series(args.input, args.detector or DEFAULT_DETECTOR)
            frame.to_csv(out, index=False)
            print(
                f"{int(frame['is_anomaly'].sum())} anomalies in {len(frame)} rows", file=sys.stderr
            )
        else:
            if args.detector:
                raise EagleEyeError(
                    "--detector picks a timestamp,value series' detector; a trace's detectors "
                    "come from --config or --live"
                )
            if args.live and args.config:
                raise EagleEyeError("--live and --config both choose the detectors; give one")
            config = load_config(args.config)
            if args.live:
                from eagleeye.detection import replay_config

                config = replay_config()
            scorers = _learned(args)
            count = write_findings(detect_trace(args.input, config, scorers, args.scores), out)
            print(f"{count} findings", file=sys.stderr)
    finally:
        if args.output:
            out.close()
    return 0
