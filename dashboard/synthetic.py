"""A synthetic run store at scale, for the dashboard's benchmark and browser tests.

``build(run_dir, ranks, steps)`` writes what a finished job of ``ranks`` ranks (8 per host)
and ``steps`` steps leaves in its store: every rank's hook samples each step, lifecycle
events, a straggler (rank ``ranks * 3 // 5``, 60 % slower in the second half), its
finding and the action that answered it, and a checkpoint every 100 steps. The records go
through the store's own writer for everything but the samples, which are bulk-inserted
into the same table, its indexes built after the insert.

``python -m dashboard.synthetic RUN_DIR --ranks 512 --steps 1000``
"""

from __future__ import annotations

import argparse
import sqlite3
from pathlib import Path

import numpy as np

from collector.types import Subject
from detectors.types import Finding, Severity
from eagleeye.store import DB_NAME, RunStore
from ft_runtime.types import Action, ActionKind, LifecycleEvent, Outcome, OutcomeStatus, Phase

START = 1_767_225_600.0  # 2026-01-01 00:00 UTC
STEP_S = 0.5
PER_HOST = 8
#: The hook's per-step samples (name, typical value); the sections add up to step_time.
METRICS: dict[str, float] = {
    "step_time": 0.45,
    "section.data": 0.02,
    "section.forward": 0.15,
    "section.backward": 0.25,
    "section.optimizer": 0.03,
    "collective_time": 0.05,
    "loss": 4.0,
    "grad_norm": 1.0,
    "lr": 3e-4,
    "tokens": 4096.0,
}
SMALL = ("step_time", "section.data", "section.forward", "collective_time")


def straggler(ranks: int) -> int:
    return ranks * 3 // 5


def build(run_dir: Path, ranks: int, steps: int, metrics: tuple[str, ...] = ()) -> int:
    """Writes the run; returns the number of samples."""
    run_dir.mkdir(parents=True, exist_ok=True)
    names = metrics or tuple(METRICS)
    slow = straggler(ranks)
    half = steps // 2
    _records(run_dir, ranks, steps, slow, half)
    rng = np.random.default_rng(0)
    conn = sqlite3.connect(run_dir / DB_NAME)
    # The store's own indexes, dropped for the bulk insert and built again after it.
    indexes = conn.execute(
        "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'samples'"
    ).fetchall()
    for index, _ in indexes:
        conn.execute(f"DROP INDEX {index}")
    rank = np.arange(ranks)
    node = np.array([f"node{r // PER_HOST:04d}" for r in rank], dtype=object)
    replica = rank // max(1, ranks // 8)
    for step in range(steps):
        t = START + (step + 1) * STEP_S
        rows: list[tuple[object, ...]] = []
        for name in names:
            value = METRICS[name] * (1.0 + 0.05 * rng.standard_normal(ranks))
            if name == "loss":
                value = value * (1.0 + 2.0 / (1.0 + step / 50))
            if step >= half and name in ("step_time", "section.forward"):
                value[slow] *= 1.6
            rows.extend(
                zip(
                    np.full(ranks, t).tolist(),
                    np.full(ranks, step).tolist(),
                    np.zeros(ranks, dtype=int).tolist(),
                    rank.tolist(),
                    replica.tolist(),
                    node.tolist(),
                    [name] * ranks,
                    value.tolist(),
                    strict=True,
                )
            )
        conn.executemany("INSERT INTO samples VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
    for _, sql in indexes:
        conn.execute(sql)
    conn.commit()
    conn.close()
    return ranks * steps * len(names)


def _records(run_dir: Path, ranks: int, steps: int, slow: int, half: int) -> None:
    store = RunStore(run_dir, flush_interval_s=1.0, max_batch=100_000)
    store.set_meta("run_id", run_dir.name)
    store.set_meta("config", {"replicas": 8, "nnodes": ranks // PER_HOST})
    store.add_event(LifecycleEvent("job", Phase.LAUNCH, START, 0, {}))
    for rank in range(ranks):
        detail = {"replica": rank // max(1, ranks // 8), "node": f"node{rank // PER_HOST:04d}"}
        store.add_event(LifecycleEvent(f"rank:{rank}", Phase.LAUNCH, START, 0, detail))
    found_at = START + (half + 6) * STEP_S
    subject = Subject(rank=slow, node=f"node{slow // PER_HOST:04d}")
    evidence = {"compute_ms": 640.0, "compute_ms_peer_median": 400.0, "ratio": 1.6}
    finding = Finding(
        "slow_rank", subject, 6.0, Severity.WARN, found_at, half + 6, evidence, "peer"
    )
    fid = store.add_finding(finding)
    action = Action(ActionKind.NOTIFY, f"rank:{slow}", "straggler", f"notify-{slow}")
    store.add_outcome(Outcome(action, OutcomeStatus.DONE, "sent", found_at), fid, False, found_at)
    for step in range(99, steps, 100):
        t = START + (step + 1.2) * STEP_S
        store.add_checkpoint(t, step, "PERSISTENT", "disk", rank=0, attempt=0, nbytes=3 << 30)
    end = START + (steps + 1) * STEP_S
    store.add_event(LifecycleEvent("job", Phase.SUCCEEDED, end, 0, {}))
    result = {"succeeded": True, "started": START, "ended": end + 1.0, "attempts": 1}
    store.set_meta("result", result)
    store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--ranks", type=int, default=512)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--small", action="store_true", help=f"only {', '.join(SMALL)}")
    args = parser.parse_args()
    count = build(args.run_dir, args.ranks, args.steps, SMALL if args.small else ())
    print(f"{args.run_dir}: {count:,} samples, {args.ranks} ranks, {args.steps} steps")


if __name__ == "__main__":
    main()
