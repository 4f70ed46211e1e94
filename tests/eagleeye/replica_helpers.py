"""Helpers for the replica-recovery end-to-end tests: run a job, read what it did."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from eagleeye.launch import JobConfig, JobResult, run_job
from eagleeye.store import RunReader
from ft_runtime.layout import JobLayout
from ft_runtime.types import Outcome


def workload(
    steps: int, params_out: Path, preset: str = "small", step_floor_s: float = 0.1
) -> list[str]:
    """The test workload; steps padded to 0.1 s so survivors cannot outrun a restart (a
    run with no fault to outrun may go at its own pace: ``step_floor_s`` 0)."""
    return [
        "--step-floor-s",
        str(step_floor_s),
        "--preset",
        preset,
        "--steps",
        str(steps),
        "--batch-size",
        "2",
        "--block-size",
        "32",
        "--params-out",
        str(params_out),
    ]


def run_replicas(
    tmp_path: Path,
    name: str,
    steps: int,
    inject: tuple[str, ...] = (),
    layout: JobLayout | None = None,
    step_floor_s: float = 0.1,
    **extra: object,
) -> JobResult:
    config = JobConfig(
        script="eagleeye.workload.train",
        module=True,
        script_args=workload(steps, tmp_path / name / "params", step_floor_s=step_floor_s),
        layout=layout or JobLayout(3, 1, 3),
        recovery="replica",
        remediate=True,
        inject=inject,
        runs_dir=str(tmp_path / name),
        run_id=name,
        **extra,  # type: ignore[arg-type]
    )
    return run_job(config)


def final_params_identical(folder: Path) -> tuple[int, bool]:
    """How many ranks saved final parameters, and whether all are bitwise equal."""
    states = [torch.load(p, weights_only=True) for p in sorted(folder.glob("rank-*.pt"))]
    same = all(all(torch.equal(states[0][k], s[k]) for k in states[0]) for s in states[1:])
    return len(states), same


def steps_table(run_dir: Path) -> pd.DataFrame:
    """Long table of the per-step metrics of a run."""
    reader = RunReader(run_dir)
    try:
        return reader.samples(
            names=["step_time", "batch", "replicas", "catch_up", "loss", "exchange_retries"]
        )
    finally:
        reader.close()


def events(run_dir: Path) -> pd.DataFrame:
    reader = RunReader(run_dir)
    try:
        return reader.events()
    finally:
        reader.close()


def finish(sup: Any, sent: Outcome, timeout_s: float = 90.0) -> Outcome:
    """The final outcome of ``sent`` (a command answered as pending), polling the supervisor
    as the controller's ticks do."""
    if sent.final:
        return sent
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        sup.poll()
        for outcome in sup.outcomes():
            if outcome.action.key == sent.action.key:
                return outcome
        time.sleep(0.01)
    raise AssertionError(f"{sent.action} did not end within {timeout_s} s: {sent.detail}")


def trained_once(ledger: Path, steps: int) -> dict[int, list[int]]:
    """Every replica's trained batches, from the audit lines of the committed steps; for
    a step committed more than once (a job restart went back before it), the newest
    incarnation's line counts. Asserts that no batch was trained twice."""
    newest: dict[int, tuple[int, list[list[int]]]] = {}
    for path in ledger.glob("replica-*.jsonl"):
        incarnation = int(path.stem.rsplit("-", 1)[1])
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            step = entry["step"]
            if step not in newest or newest[step][0] < incarnation:
                newest[step] = (incarnation, entry["trained"])
    batches: dict[int, list[int]] = {}
    for step in sorted(newest):
        for replica, batch in newest[step][1]:
            batches.setdefault(replica, []).append(batch)
    for replica, got in batches.items():
        assert sorted(got) == got, f"replica {replica} trained out of order: {got}"
        assert len(set(got)) == len(got), f"replica {replica} trained a batch twice: {got}"
        assert got == list(range(len(got))), f"replica {replica} skipped a batch: {got}"
    assert sorted(newest) == list(range(steps)), sorted(newest)
    return batches
