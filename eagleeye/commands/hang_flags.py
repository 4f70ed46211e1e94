"""The flags of `eagleeye run` that set the limits of hang detection and zero-code
telemetry (`--hang-*` mirror the ``[hang]`` table of the detectors' config file)."""

from __future__ import annotations

import argparse

#: flag suffix, limit name, help
_LIMITS = (
    ("k", "k", "silence limit in median step times, the floor of every waiting verdict (10)"),
    ("min-silence-s", "min_silence_s", "floor on that silence limit, seconds (5)"),
    ("stopped-k", "stopped_k", "median step times a stopped (SIGSTOP) rank must stay so (2)"),
    ("stopped-s", "stopped_s", "floor on that, seconds; the limit before any step (0.25)"),
    ("blocked-s", "blocked_s", "uninterruptible sleep without CPU time that is a hang (60)"),
    ("idle-s", "idle_s", "a rank idle this long while its peers wait for it is hung (600)"),
    ("collective-s", "collective_s", "every rank waiting this long in a collective (120)"),
)


def add_hang_arguments(p: argparse.ArgumentParser) -> None:
    """Adds ``--no-instrument`` and one ``--hang-*`` flag per hang limit."""
    g = p.add_argument_group(
        "telemetry and hangs",
        "A job is judged hung only on evidence: a rank stopped or blocked (/proc), a rank "
        "idle while its peers wait in a collective, a collective that never completes. "
        "Flags override the [hang] table of $EAGLEEYE_DETECTORS_CONFIG.",
    )
    g.add_argument(
        "--no-instrument",
        dest="instrument",
        action="store_false",
        help="do not load the zero-code telemetry (optimizer steps, loss, collectives) into "
        "the ranks; only the in-loop hook reports",
    )
    for flag, name, text in _LIMITS:
        g.add_argument(
            f"--hang-{flag}",
            dest=f"hang_{name}",
            type=_positive_float,
            default=None,
            metavar="X",
            help=text,
        )


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
    return value
