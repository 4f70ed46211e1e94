"""The `eagleeye` console script: one parser, one module per subcommand.

A subcommand only parses its arguments, builds config objects and calls a library function.
Errors that come from bad input print one line and exit with status 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from collector.errors import CollectorError
from detectors.errors import DetectorError
from eagleeye.commands import COMMANDS
from eagleeye.errors import EagleEyeError
from ft_runtime.errors import FTRuntimeError
from remediation.errors import RemediationError

USER_ERRORS = (EagleEyeError, CollectorError, DetectorError, RemediationError, FTRuntimeError)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="eagleeye",
        description=(
            "Eagle Eye keeps large training jobs productive: it launches and supervises ranks, "
            "watches their telemetry, detects faults and remediates them."
        ),
    )
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except USER_ERRORS as exc:
        print(f"eagleeye {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"eagleeye {args.command}: interrupted", file=sys.stderr)
        return 130


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"eagleeye {version('eagleeye')}"
    except PackageNotFoundError:
        return "eagleeye (not installed)"


if __name__ == "__main__":
    sys.exit(main())
