"""`eagleeye dashboard`: serve the Streamlit dashboard on loopback."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "dashboard",
        help="serve the dashboard of a run (the newest by default) on loopback",
        description=(
            "Serves the Streamlit dashboard: overview, ranks heatmaps, training curves, "
            "findings, actions, checkpoints and the planner. It reads the run store while a "
            "run is writing. It binds to 127.0.0.1 unless --address says otherwise."
        ),
    )
    p.add_argument("--run", default=None, help="run folder to show (default: the newest)")
    p.add_argument("--runs-dir", default="runs", help="folder of run folders (default: runs)")
    p.add_argument("--address", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8501, help="port (default: 8501)")
    p.set_defaults(func=_dashboard)


def command(args: argparse.Namespace) -> list[str]:
    """The streamlit command line for these arguments."""
    app = Path(__file__).resolve().parents[2] / "dashboard" / "streamlit_app.py"
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(app),
        "--server.address",
        args.address,
        "--server.port",
        str(args.port),
        "--server.headless",
        "true",
        "--browser.gatherUsageStats",
        "false",
        "--client.toolbarMode",
        "minimal",
    ]


def _dashboard(args: argparse.Namespace) -> int:
    from eagleeye.errors import EagleEyeError
    from eagleeye.store import RunReader, newest_run

    run = Path(args.run) if args.run else newest_run(args.runs_dir)
    with RunReader(run) as reader:  # a bad folder or file is a clear error now, not on a page
        reader.check()
    try:
        import streamlit  # noqa: F401
    except ImportError:
        raise EagleEyeError(
            "the dashboard needs streamlit: pip install 'eagleeye[dashboard]'"
        ) from None
    env = {
        **os.environ,
        "EAGLEEYE_DASHBOARD_RUN": str(run.resolve()),
        "EAGLEEYE_RUNS_DIR": str(Path(args.runs_dir).resolve()),
    }
    print(f"Eagle Eye dashboard for {run} on http://{args.address}:{args.port}", flush=True)
    # Streamlit takes this process's place, so a signal to it (Ctrl-C, a supervisor's
    # SIGTERM) reaches the server itself instead of leaving it running orphaned.
    argv = command(args)
    os.execve(argv[0], argv, env)
