"""The `eagleeye` console script: one parser, one module per subcommand.

A subcommand only parses its arguments, builds config objects and calls a library function.
Errors that come from bad input print one line and exit with status 2.
"""

from __future__ import annotations

import argparse
import os
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
    args = parser.parse_args(_joined_values(sys.argv[1:] if argv is None else list(argv)))
    try:
        return int(args.func(args) or 0)
    except USER_ERRORS as exc:
        print(f"eagleeye {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"eagleeye {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader of standard output left (`| head`): nothing more to write, and nothing
        # wrong with the command. Output goes nowhere from here so the exit is quiet too.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


VALUE_FLAGS = ("--resume-args",)
"""Flags whose value is itself a script's flags (``--resume-args --init_from=resume``)."""


def _joined_values(argv: list[str]) -> list[str]:
    """``--resume-args --x`` as ``--resume-args=--x``: argparse would take the value for a
    flag of its own. Only before the first ``--`` (what follows belongs to the script).

    >>> _joined_values(["run", "--resume-args", "--init_from=resume", "t.py"])
    ['run', '--resume-args=--init_from=resume', 't.py']
    """
    joined: list[str] = []
    rest = iter(argv)
    for arg in rest:
        if arg == "--":
            joined += [arg, *rest]
            break
        if arg in VALUE_FLAGS:
            value = next(rest, None)
            joined.append(arg if value is None else f"{arg}={value}")
        else:
            joined.append(arg)
    return joined


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"eagleeye {version('eagleeye')}"
    except PackageNotFoundError:
        return "eagleeye (not installed)"


if __name__ == "__main__":
    sys.exit(main())
