"""`eagleeye detect`: run the configured detectors over a recorded trace or a series."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

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
        "--output", "-o", type=Path, default=None, help="where to write (default: standard output)"
    )
    p.add_argument(
        "--config",
        type=Path,
        default=None,
        help="detector config TOML (default: $EAGLEEYE_DETECTORS_CONFIG or built-in)",
    )
    p.add_argument(
        "--live",
        action="store_true",
        help="the detector set of live runs (for traces exported with `eagleeye eval export`)",
    )
    p.set_defaults(func=_detect)


def _detect(args: argparse.Namespace) -> int:
    from detectors.config import load_config
    from detectors.eval.harness import detect_series, detect_trace, is_series_file, write_findings

    out = args.output.open("w") if args.output else sys.stdout
    try:
        if is_series_file(args.input):
            frame = detect_series(args.input)
            frame.to_csv(out, index=False)
            print(
                f"{int(frame['is_anomaly'].sum())} anomalies in {len(frame)} rows", file=sys.stderr
            )
        else:
            if args.live and args.config:
                raise EagleEyeError("--live and --config both choose the detectors; give one")
            config = load_config(args.config)
            if args.live:
                from eagleeye.detection import replay_config

                config = replay_config()
            count = write_findings(detect_trace(args.input, config), out)
            print(f"{count} findings", file=sys.stderr)
    finally:
        if args.output:
            out.close()
    return 0
