"""The flags of `eagleeye run` that set the limits of hang detection and zero-code
telemetry (`--hang-*` mirror the ``[hang]`` table of the detectors' config file)."""

from __future__ import annotations

import argparse

from detectors.progress import HangLimits

#: limit name, help (the flag is --hang-NAME with dashes)
_LIMITS = (
    ("k", "silence limit in median step times, the floor of every waiting verdict"),
    ("min_silence_s", "floor on that silence limit, seconds"),
    ("stopped_k", "median step times a stopped (SIGSTOP) rank must stay so"),
    ("stopped_s", "floor on that, seconds; the limit before any step"),
    ("blocked_s", "uninterruptible sleep without CPU time that is a hang, seconds"),
    ("idle_s", "a rank idle this long while its peers wait for it is hung, seconds"),
    ("collective_s", "every rank waiting this long in one collective is a hang, seconds"),
)


#: The limits `eagleeye controller` judges a job across hosts by (a rank blocked while
#: the others wait in a collective: eagleeye.agents.waits).
CLUSTER_LIMITS = ("k", "min_silence_s", "blocked_s", "idle_s")
CLUSTER_HANGS = (
    "With --recovery job, a rank its host reports running (not in a collective, not "
    "paused) while others report waiting in one, after no step of the job completed for "
    "the silence limit, is hung only when its main thread has gained no CPU time for "
    "--hang-idle-s, or sat in uninterruptible sleep (D) without CPU time for "
    "--hang-blocked-s (its host's look at /proc; a busy rank is working, as with eagleeye "
    "run); a stopped rank (SIGSTOP) is hung sooner."
)


def add_hang_arguments(
    p: argparse.ArgumentParser,
    names: tuple[str, ...] | None = None,
    instrument: bool = True,
    about: str = "A job is judged hung only on evidence: a rank stopped or blocked (/proc), a "
    "rank idle while its peers wait in a collective, a collective that never completes.",
) -> None:
    """Adds ``--no-instrument`` (unless ``instrument`` is False) and one ``--hang-*`` flag
    per hang limit (those of ``names`` when given)."""
    g = p.add_argument_group(
        "telemetry and hangs",
        f"{about} Flags override the [hang] table of $EAGLEEYE_DETECTORS_CONFIG.",
    )
    if instrument:
        add_instrument(g)
    defaults = HangLimits()
    for name, text in _LIMITS:
        if names is not None and name not in names:
            continue
        g.add_argument(
            f"--hang-{name.replace('_', '-')}",
            dest=f"hang_{name}",
            type=_positive_float,
            default=None,
            metavar="X",
            help=f"{text} (default: {getattr(defaults, name):g})",
        )


def add_instrument(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """Adds ``--no-instrument``: the ranks start through ``eagleeye.boot`` unless given."""
    p.add_argument(
        "--no-instrument",
        dest="instrument",
        action="store_false",
        help="do not load the zero-code telemetry (optimizer steps, loss, collectives) "
        "into the ranks; only the in-loop hook reports",
    )


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
    return value


def hang_limits(args: argparse.Namespace) -> HangLimits:
    """The hang limits: the ``--hang-*`` flags given, over the ``[hang]`` table of
    $EAGLEEYE_DETECTORS_CONFIG, over the defaults."""
    from eagleeye.launch import detector_config, hang_flags

    return detector_config(hang_flags(args))[0]
