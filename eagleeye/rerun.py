"""`eagleeye run --resume RUN_DIR`: a run whose controller died (or was stopped) goes on.

Everything the run needs is in its store: the job's configuration (the ranks' command,
layout, recovery, policy, limits, the script's resume flags), the attempts it ran and the
checkpoints its ranks reported. The resumed run writes into the same folder and store, as
the next attempt, with the newest complete checkpoint in ``EAGLEEYE_RESUME_FROM`` and the
script's resume flags, like any restart; faults injected into the first run are not
injected again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagleeye.errors import EagleEyeError, StoreError
from eagleeye.store import RunReader
from ft_runtime.layout import JobLayout

BOOT = ["-m", "eagleeye.boot"]


@dataclass(frozen=True, slots=True)
class StoredRun:
    """What a run's store says about it, for resuming it."""

    run_dir: Path
    run_id: str
    config: dict[str, Any]
    last_attempt: int
    checkpoints: tuple[tuple[int, int, str], ...]  # (rank, step, path), disk tier


def read_stored_run(run_dir: str | Path) -> StoredRun:
    """Reads what resuming needs; a run that cannot be resumed is one clear error."""
    folder = Path(run_dir)
    if not (folder / "run.db").is_file():
        raise EagleEyeError(f"--resume {run_dir}: no run store (run.db) there; give a run folder")
    try:
        with RunReader(folder) as reader:
            meta = reader.meta()
            events = reader.events()
            saved = reader.checkpoints()
    except StoreError as exc:
        raise EagleEyeError(f"--resume {run_dir}: {exc}") from None
    config = meta.get("config")
    if not isinstance(config, dict) or "command" not in config:
        raise EagleEyeError(f"--resume {run_dir}: the store holds no job configuration")
    if (meta.get("result") or {}).get("succeeded"):
        raise EagleEyeError(f"--resume {run_dir}: the run succeeded; there is nothing to resume")
    disk = saved[(saved["tier"] == "disk") & saved["path"].notna() & saved["rank"].notna()]
    disk = disk[disk["state"] == "PERSISTENT"]
    return StoredRun(
        folder,
        str(meta.get("run_id", folder.name)),
        config,
        int(events["attempt"].max()) if not events.empty else -1,
        tuple(
            (int(r), int(s), str(p))
            for r, s, p in zip(disk["rank"], disk["step"], disk["path"], strict=True)
        ),
    )


def target_of(command: list[str], instrument: bool) -> tuple[str, list[str], bool]:
    """(script, its arguments, whether it is a module) from the ranks' stored command.

    >>> target_of(["-m", "eagleeye.boot", "/x/train.py", "--lr", "1"], True)
    ('/x/train.py', ['--lr', '1'], False)
    >>> target_of(["-m", "pkg.train", "--lr", "1"], False)
    ('pkg.train', ['--lr', '1'], True)
    """
    target = command[len(BOOT) :] if instrument and command[: len(BOOT)] == BOOT else command
    if target[:1] == ["-m"] and len(target) >= 2:
        return target[1], list(target[2:]), True
    if not target:
        raise EagleEyeError("the stored command names no script")
    return target[0], list(target[1:]), False


def layout_of(config: dict[str, Any]) -> JobLayout:
    return JobLayout(
        int(config.get("nnodes", 1)),
        int(config.get("nproc_per_node", 1)),
        int(config.get("replicas", 1)),
    )
