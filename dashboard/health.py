"""What the dashboard shows, computed from run-store DataFrames (no Streamlit here).

Kept free of Streamlit so it is tested directly and reused by every page.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

HEALTH_ORDER = ("ok", "finding", "stale", "exited")


@dataclass(frozen=True, slots=True)
class JobStatus:
    phase: str
    attempt: int
    current_step: int
    steps_per_s: float
    tokens_per_s: float
    ettr: float
    wall_s: float


def job_status(events: pd.DataFrame, steps: pd.DataFrame, now: float) -> JobStatus:
    """Phase, progress, recent throughput and ETTR.

    ETTR (effective training time ratio) counts each step of the final trajectory once, at
    the median step time, against the wall time so far: work redone after a restart and
    time spent restarting are what it loses.
    """
    jobs = events[events["subject"] == "job"] if not events.empty else events
    phase = str(jobs["phase"].iloc[-1]) if not jobs.empty else "unknown"
    attempt = int(jobs["attempt"].iloc[-1]) if not jobs.empty else 0
    started = float(events["time"].min()) if not events.empty else now
    finished = phase in ("succeeded", "failed")
    end = float(events["time"].max()) if finished and not events.empty else now
    wall = max(end - started, 1e-9)
    step_times = steps[steps["name"] == "step_time"] if not steps.empty else steps
    if step_times.empty:
        return JobStatus(phase, attempt, -1, 0.0, 0.0, math.nan, wall)
    current = int(step_times["step"].max())
    recent = step_times[step_times["time"] >= step_times["time"].max() - 30.0]
    span = recent["time"].max() - recent["time"].min()
    distinct = recent.drop_duplicates(["attempt", "step"]).shape[0]
    steps_per_s = (distinct - 1) / span if span > 0 and distinct > 1 else 0.0
    tokens = steps[(steps["name"] == "tokens") & (steps["time"] >= recent["time"].min())]
    tokens_per_s = tokens["value"].sum() / span if span > 0 else 0.0
    median_step = float(step_times.groupby(["attempt", "step"])["value"].max().median())
    ettr = min(1.0, (current + 1) * median_step / wall)
    return JobStatus(phase, attempt, current, steps_per_s, tokens_per_s, ettr, wall)


def rank_health(
    ranks: pd.DataFrame,
    steps: pd.DataFrame,
    findings: pd.DataFrame,
    events: pd.DataFrame,
    now: float,
    stale_s: float = 30.0,
) -> pd.DataFrame:
    """One row per rank: replica, node, last step, and health in HEALTH_ORDER.

    ``ranks`` lists the job's ranks (rank, replica, node). A rank is ``exited`` when its
    process ended non-zero in the newest attempt, ``finding`` when a finding names it in
    that attempt, ``stale`` when the job runs and the rank has not stepped for ``stale_s``.
    """
    columns = ["rank", "replica", "node", "last_step", "health"]
    if events.empty:
        return pd.DataFrame(columns=columns)
    attempt = int(events["attempt"].max())
    current = events[events["attempt"] == attempt]
    since = float(current["time"].min())
    phases = events.loc[events["subject"] == "job", "phase"]
    running = not phases.empty and str(phases.iloc[-1]) in ("launch", "running", "recovering")
    failed = {
        str(e["subject"])
        for e in current.to_dict("records")
        if e["phase"] == "exited" and e["detail"].get("exit_code", 0) != 0
    }
    flagged = set()
    if not findings.empty:
        flagged = {int(r) for r in findings.loc[findings["time"] >= since, "rank"].dropna()}
    step_times = steps[steps["name"] == "step_time"] if not steps.empty else steps
    by_rank = step_times.groupby("rank").agg(step=("step", "max"), time=("time", "max"))
    last_step = {int(r): int(s) for r, s in zip(by_rank.index, by_rank["step"], strict=True)}
    last_time = {int(r): float(t) for r, t in zip(by_rank.index, by_rank["time"], strict=True)}
    rows = []
    for row in ranks.to_dict("records"):
        rank = int(row["rank"])
        health = "ok"
        if f"rank:{rank}" in failed:
            health = "exited"
        elif rank in flagged:
            health = "finding"
        elif running and now - last_time.get(rank, now) > stale_s:
            health = "stale"
        rows.append({**row, "last_step": last_step.get(rank, -1), "health": health})
    return pd.DataFrame(rows, columns=columns)


def ranks_of(events: pd.DataFrame) -> pd.DataFrame:
    """The job's ranks with their replica and node, from their launch events."""
    rows: dict[int, dict[str, object]] = {}
    for event in events.to_dict("records"):
        subject = str(event["subject"])
        if event["phase"] == "launch" and subject.startswith("rank:"):
            rank = int(subject.removeprefix("rank:"))
            rows[rank] = {
                "rank": rank,
                "replica": event["detail"].get("replica"),
                "node": event["detail"].get("node"),
            }
    return pd.DataFrame([rows[r] for r in sorted(rows)], columns=["rank", "replica", "node"])
