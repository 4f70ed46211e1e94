"""Run folders: ``runs/<run-id>/`` holding ``run.db``, ``logs/`` and ``checkpoints/``."""

from __future__ import annotations

import os
import re
import secrets
import time
from pathlib import Path

from eagleeye.errors import EagleEyeError
from eagleeye.store.writer import DB_NAME

_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def new_run_id(prefix: str = "run") -> str:
    return f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def create_run_dir(runs_dir: str | Path, run_id: str) -> Path:
    """Creates ``runs_dir/run_id``; raises EagleEyeError with the reason if it cannot."""
    if not _RUN_ID.match(run_id):
        raise EagleEyeError(f"bad run id {run_id!r}: use letters, digits, '.', '_' and '-'")
    root = Path(runs_dir)
    run_dir = root / run_id
    if run_dir.exists():
        raise EagleEyeError(f"run folder {run_dir} exists already; choose another --run-id")
    try:
        (run_dir / "logs").mkdir(parents=True)
        (run_dir / "checkpoints").mkdir()
    except OSError as exc:
        raise EagleEyeError(
            f"cannot create run folder {run_dir}: {exc.strerror}; pass a writable --runs-dir"
        ) from None
    if not os.access(run_dir, os.W_OK):
        raise EagleEyeError(f"run folder {run_dir} is not writable; pass a writable --runs-dir")
    return run_dir


def newest_run(runs_dir: str | Path) -> Path:
    """The most recently created run folder that holds a store."""
    candidates = [p.parent for p in Path(runs_dir).glob(f"*/{DB_NAME}")]
    if not candidates:
        raise EagleEyeError(
            f"no runs under {runs_dir}; start one with `eagleeye run` or `eagleeye demo`"
        )
    return max(candidates, key=lambda p: p.stat().st_mtime)
