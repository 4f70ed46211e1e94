"""What the dashboard shows, computed from run-store DataFrames (no Streamlit here).

Kept free of Streamlit so it is tested directly and reused by every page. ETTR and
throughput come from the summary's own functions, so the dashboard and the terminal
summary show the same figures for the same run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pandas as pd

from eagleeye.goodput import effective_training
from eagleeye.summary import throughput

#: Rank health, from the best to the worst; the colour of each in the same order.
HEALTH_ORDER = ("ok", "recovered", "stale", "finding", "waiting", "hung", "exited")
HEALTH_COLOURS = ("#2e7d32", "#1565c0", "#9e9e9e", "#f9a825", "#ef6c00", "#6a1b9a", "#c62828")
#: Progress states (the store's meta ``progress``) of a rank that cannot go on.
CULPRIT_STATES = frozenset({"stopped", "blocked"})
#: Findings that mean a rank stopped: stepping after one of them is a recovery.
STOPPING = frozenset({"process_exit", "hang"})
FINISHED = frozenset({"succeeded", "failed"})
RECENT_S = 30.0


@dataclass(frozen=True, slots=True)
class Hang:
    """An ongoing hang: when it was found, the ranks that cannot go on (culprits) and the
    ranks waiting for them. A job-wide hang (a collective that never completes) has no
    culprit."""

    since: float
    step: int | None
    culprits: tuple[int, ...]
    waiting: tuple[int, ...]
    reason: str


@dataclass(frozen=True, slots=True)
class JobStatus:
    """The job now. ``steps_per_s``, ``tokens_per_s`` and ``ettr`` are the summary's
    figures (over the wall time so far while the job runs); ``recent_steps_per_s`` counts
    only the last ``RECENT_S`` seconds up to now (and none from before an ongoing hang was
    found), so it is 0 while nothing moves."""

    phase: str
    attempt: int
    current_step: int
    steps_per_s: float
    tokens_per_s: float
    recent_steps_per_s: float
    ettr: float
    wall_s: float
    hang: Hang | None


def job_phase(events: pd.DataFrame) -> tuple[str, int]:
    """The job's newest lifecycle phase and attempt ("unknown", 0 before any)."""
    jobs = events[events["subject"] == "job"] if not events.empty else events
    if jobs.empty:
        return "unknown", 0
    return str(jobs["phase"].iloc[-1]), int(jobs["attempt"].iloc[-1])


def job_status(
    events: pd.DataFrame,
    steps: pd.DataFrame,
    meta: dict[str, Any],
    findings: pd.DataFrame,
    now: float,
) -> JobStatus:
    """Phase (``hung`` while a hang lasts), progress, throughput and ETTR.

    ``steps`` holds the ``step_time`` samples (time, step, attempt, rank, value), the
    ``replicas`` samples and the ``tokens`` samples (or their sum as one row).
    """
    phase, attempt = job_phase(events)
    result = meta.get("result") or {}
    if result:
        wall = float(result.get("ended", 0.0)) - float(result.get("started", 0.0))
    else:
        started = float(events["time"].min()) if not events.empty else now
        wall = now - started
    replicas = int((meta.get("config") or {}).get("replicas", 1))
    hang = None if phase in FINISHED else ongoing_hang(events, steps, findings, meta)
    if hang is not None:
        phase = "hung"
    step_times = steps[steps["name"] == "step_time"] if not steps.empty else steps
    if step_times.empty:
        return JobStatus(phase, attempt, -1, 0.0, 0.0, 0.0, math.nan, wall, hang)
    steps_per_s, tokens_per_s = throughput(steps, wall)
    ettr, _ = effective_training(steps, replicas)
    end = float(step_times["time"].max()) if phase in FINISHED else now
    span = min(RECENT_S, max(wall, 1e-9))
    if hang is not None:  # nothing has moved since the hang was found
        span = max(min(span, now - hang.since), 1e-9)
    recent = step_times[step_times["time"] > end - span]
    distinct = recent.drop_duplicates(["attempt", "step"]).shape[0]
    return JobStatus(
        phase,
        attempt,
        int(step_times["step"].max()),
        steps_per_s,
        tokens_per_s,
        distinct / span,
        ettr,
        wall,
        hang,
    )


def ongoing_hang(
    events: pd.DataFrame, steps: pd.DataFrame, findings: pd.DataFrame, meta: dict[str, Any]
) -> Hang | None:
    """The newest hang finding of the current attempt while no step has ended after it.

    Culprits are the finding's own rank and its ``culprit_rank_*`` evidence, with the ranks
    whose progress (the store's meta) is stopped or blocked. Every other rank waits: no
    step has ended since the finding, so none moves (the evidence lists only the ranks
    already waiting when it fired, and at most eight).
    """
    if findings.empty or events.empty:
        return None
    since = attempt_start(events)
    hangs = findings[(findings["kind"] == "hang") & (findings["time"] >= since)]
    if hangs.empty:
        return None
    newest = hangs.iloc[-1]
    step_times = steps[steps["name"] == "step_time"] if not steps.empty else steps
    if not step_times.empty and float(step_times["time"].max()) > float(newest["time"]):
        return None
    evidence = dict(newest["evidence"])
    culprits = {int(v) for k, v in evidence.items() if k.startswith("culprit_rank_")}
    if newest["scope"] == "rank" and not pd.isna(newest["rank"]):
        culprits.add(int(newest["rank"]))
    progress = {int(r): str(s) for r, s in (meta.get("progress") or {}).items()}
    culprits |= {r for r, s in progress.items() if s in CULPRIT_STATES}
    waiting = {int(v) for k, v in evidence.items() if k.startswith("waiting_rank_")}
    waiting |= set(ranks_of(events)["rank"].astype(int))
    reason = next((k for k, v in evidence.items() if v == 1.0 and not k[-1].isdigit()), "")
    return Hang(
        float(newest["time"]),
        None if pd.isna(newest["step"]) else int(newest["step"]),
        tuple(sorted(culprits)),
        tuple(sorted(waiting - culprits)),
        reason,
    )


def attempt_start(events: pd.DataFrame) -> float:
    """When the newest attempt began."""
    current = events[events["attempt"] == events["attempt"].max()]
    return float(current["time"].min())


def rank_health(
    ranks: pd.DataFrame,
    steps: pd.DataFrame,
    findings: pd.DataFrame,
    events: pd.DataFrame,
    now: float,
    hang: Hang | None = None,
    progress: dict[str, str] | None = None,
    stale_s: float = 30.0,
) -> pd.DataFrame:
    """One row per rank: replica, node, last step, progress and health (HEALTH_ORDER).

    ``exited``: its newest lifecycle event is a non-zero exit, or it stopped and has not
    stepped since. ``hung``/``waiting``: the
    culprit of an ongoing hang and the ranks waiting for it. ``finding``: a finding other
    than an exit or a hang names it in the current attempt. ``stale``: the job runs and
    the rank has not stepped for ``stale_s``. ``recovered``: it exited or hung earlier and
    has stepped since.
    """
    columns = ["rank", "replica", "node", "last_step", "progress", "health"]
    if events.empty or ranks.empty:
        return pd.DataFrame(columns=columns)
    phase, _ = job_phase(events)
    running = phase in ("launch", "running", "recovering")
    exited, stopped = _exits_and_stops(events, findings)
    since = attempt_start(events)
    flagged: set[int] = set()
    if not findings.empty:
        current = findings[(findings["time"] >= since) & ~findings["kind"].isin(STOPPING)]
        flagged = {int(r) for r in current["rank"].dropna()}
    step_times = steps[steps["name"] == "step_time"] if not steps.empty else steps
    by_rank = step_times.groupby("rank").agg(step=("step", "max"), time=("time", "max"))
    last_step = by_rank["step"].astype(int).to_dict()
    last_time = by_rank["time"].astype(float).to_dict()
    culprits = set(hang.culprits) if hang else set()
    waiting = set(hang.waiting) if hang else set()
    progress = progress or {}
    rows = []
    for row in ranks.to_dict("records"):
        rank = int(row["rank"])
        stepped = last_time.get(rank, -math.inf)
        stop = stopped.get(rank)
        if rank in exited:
            health = "exited"
        elif rank in culprits:
            health = "hung"
        elif rank in waiting:
            health = "waiting"
        elif rank in flagged:
            health = "finding"
        elif running and now - last_time.get(rank, now) > stale_s:
            health = "stale"
        elif stop is not None:
            health = "recovered" if stepped > stop else "exited"
        else:
            health = "ok"
        rows.append(
            {
                **row,
                "last_step": last_step.get(rank, -1),
                "progress": progress.get(str(rank), ""),
                "health": health,
            }
        )
    return pd.DataFrame(rows, columns=columns)


def _exits_and_stops(
    events: pd.DataFrame, findings: pd.DataFrame
) -> tuple[set[int], dict[int, float]]:
    """Ranks whose newest event is a failed exit, and when each rank last stopped (a
    failed exit, or a process-exit or hang finding naming it)."""
    exited: set[int] = set()
    stopped: dict[int, float] = {}
    ranked = events[events["subject"].str.startswith("rank:")]
    for event in ranked.to_dict("records"):
        rank = int(str(event["subject"]).removeprefix("rank:"))
        if event["phase"] == "exited" and event["detail"].get("exit_code", 0) != 0:
            exited.add(rank)
            stopped[rank] = float(event["time"])
        elif event["phase"] in ("launch", "exited"):
            exited.discard(rank)
    if not findings.empty:
        named = findings[findings["kind"].isin(STOPPING)].dropna(subset=["rank"])
        newest = named.groupby("rank")["time"].max()
        for rank, time in zip(newest.index.astype(int), newest.to_numpy(), strict=True):
            stopped[int(rank)] = max(stopped.get(int(rank), -math.inf), float(time))
    return exited, stopped


def ranks_of(events: pd.DataFrame) -> pd.DataFrame:
    """The job's ranks with their replica and node, from their launch events."""
    columns = ["rank", "replica", "node"]
    if events.empty:
        return pd.DataFrame(columns=columns)
    launches = events[(events["phase"] == "launch") & events["subject"].str.startswith("rank:")]
    rows: dict[int, dict[str, object]] = {}
    for subject, detail in zip(launches["subject"], launches["detail"], strict=True):
        rank = int(str(subject).removeprefix("rank:"))
        rows[rank] = {"rank": rank, "replica": detail.get("replica"), "node": detail.get("node")}
    return pd.DataFrame([rows[r] for r in sorted(rows)], columns=columns)


__all__ = [
    "HEALTH_COLOURS",
    "HEALTH_ORDER",
    "Hang",
    "JobStatus",
    "job_status",
    "ongoing_hang",
    "rank_health",
    "ranks_of",
]
