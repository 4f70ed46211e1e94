"""Zero-code telemetry: runs a training script with Eagle Eye's instrumentation loaded.

``eagleeye run`` starts each rank as ``python -m eagleeye.boot SCRIPT ARGS...`` (or
``... -m MODULE ARGS...``) unless told ``--no-instrument``. The boot connects the rank's
telemetry, arms faulthandler for stack dumps, arranges for the zero-code instrumentation
(``collector.autoinstrument``) to be installed when the script imports torch, then runs
the script as ``__main__`` with the ``sys.argv`` and ``sys.path[0]`` that ``python SCRIPT``
would have given it. When the script ends (returns, raises or exits) the rank reports
that it is closing and hands its last telemetry over.

A boot module rather than a ``sitecustomize``: it touches only the rank process it starts
(a sitecustomize on ``PYTHONPATH`` would load into every Python process the script
spawns, DataLoader workers and compilers included, and must chain to any site's own), it
needs no change to ``PYTHONPATH``, and ``-I``/``-S`` interpreters cannot skip it.
"""

from __future__ import annotations

import os
import runpy
import sys
from collections.abc import Sequence
from pathlib import Path

from collector.autoinstrument import ZeroCode
from eagleeye.stackdump import enable_stack_dumps
from eagleeye.telemetry import RankTelemetry, rank_labels, share_telemetry

USAGE = "usage: python -m eagleeye.boot [-m MODULE | SCRIPT] [ARGS...]"


def main(argv: Sequence[str]) -> None:
    """Runs the target of ``argv`` (``SCRIPT ARGS`` or ``-m MODULE ARGS``) instrumented."""
    module = argv[:1] == ["-m"]
    rest = list(argv[1:] if module else argv)
    if not rest:
        raise SystemExit(USAGE)
    labels = rank_labels(os.environ)
    telemetry = RankTelemetry.from_env(os.environ, labels)
    share_telemetry(telemetry)
    enable_stack_dumps(os.environ, int(labels["rank"]), int(labels["attempt"]))
    zero_code = ZeroCode(telemetry.hook)
    zero_code.start()
    try:
        _run(rest[0], rest[1:], module)
    finally:
        telemetry.hook.end_pauses()
        telemetry.hook.event("closing")  # training is over: what follows is shut-down
        telemetry.close()


def _run(target: str, args: list[str], module: bool) -> None:
    if module:
        sys.argv = [target, *args]  # runpy puts the module's file in argv[0]
        runpy.run_module(target, run_name="__main__", alter_sys=True)
        return
    sys.argv = [target, *args]
    _script_path_first(Path(os.path.realpath(target)).parent)
    runpy.run_path(target, run_name="__main__")


def _script_path_first(folder: Path) -> None:
    """``python SCRIPT`` puts the script's folder first on sys.path, where ``-m`` put the
    working directory; Eagle Eye stays importable either way (last, if only there)."""
    ours = str(Path(__file__).resolve().parent.parent)
    replaced = sys.path[0] if sys.path else ""
    sys.path[0:1] = [str(folder)]
    if os.path.realpath(replaced or ".") == ours and ours not in sys.path:
        sys.path.append(ours)


if __name__ == "__main__":
    main(sys.argv[1:])
