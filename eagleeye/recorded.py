"""Labelled traces from recorded runs: a run store in, the trace format out.

A run recorded with injected faults is labelled data from the real workload. Its store
holds every rank's step report, collective timings, process exits and the faults injected;
``recorded_trace`` turns them into the labelled trace format of docs/trace-format.md, so
``eagleeye eval trace`` and ``eagleeye detect`` score the detectors on real runs.

Rows: each completed step of each attempt is one observation at the time its first rank
reported it (peers are compared within it); a report of a rank waiting in an open
collective (``in_collective``, 1 while it waits), the controller's looks at a stopped rank
(``proc_stopped``), a process exit (``exit_code``) and a relaunch (``launched``) are
observations of their own, at their own time, on the step the rank was in. The peer
features (``compute_ms``, ``data_wait_ms``, ``comm_ms``) are derived as in live runs.

Labels: one window per injected fault, on its rank, from the fault's step; a slowdown
lasts its ``steps`` (or to the end of the run), the others one step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from detectors.eval.trace import FaultWindow, Trace
from eagleeye.detection import peer_features
from eagleeye.errors import EagleEyeError
from eagleeye.store import RunReader
from ft_runtime.faults import FaultSpec, parse_specs

#: The finding kind that answers each injected fault kind.
FAULT_FINDINGS = {
    "kill": "process_exit",
    "stop": "hang",
    "slow": "slow_rank",
    "slow_collective": "slow_rank",
    "nan": "nan",
    "loss_spike": "loss_spike",
}
_KEYS = ["attempt", "step", "rank"]
_OBSERVED = ("in_collective", "proc_stopped")  # observations of their own, not step values
_MARKERS = (*_OBSERVED, "pause")


def recorded_trace(run_dir: str | Path) -> Trace:
    """The run's telemetry as a labelled trace (labels from its injected faults).

    Raises:
        EagleEyeError: the run recorded no completed step.
        StoreError: the folder holds no readable run store.
    """
    with RunReader(run_dir) as reader:
        meta = reader.meta()
        job = str(meta.get("run_id", Path(run_dir).name))
        samples = reader.samples()
        collectives = reader.collectives()
        events = reader.events()
        faults = reader.faults()
    steps = samples[samples["step"].notna() & ~samples["name"].isin(_MARKERS)]
    if "step_time" not in set(steps["name"]):
        raise EagleEyeError(f"run {run_dir} recorded no completed step; nothing to export")
    places = _places(samples)
    rows = pd.concat(
        [
            _step_rows(steps, collectives),
            _marker_rows(samples),
            _exit_rows(events, steps),
            _launch_rows(events, steps),
            _recovery_rows(events, steps),
        ],
        ignore_index=True,
    )
    rows = rows.merge(places, on="rank", how="left")
    rows["job"] = job
    rows["node"] = rows["node"].fillna("")
    rows["replica"] = rows["replica"].fillna(0).astype(int)
    injected = parse_specs(meta.get("config", {}).get("inject", []))
    labels = _labels(faults, injected, int(steps["step"].max()))
    columns = ["time", "step", "job", "replica", "node", "rank", "metric", "value"]
    return Trace.from_long(rows[columns].sort_values(["time", "rank"]), labels)


def _places(samples: pd.DataFrame) -> pd.DataFrame:
    """Each rank's node and replica, as its samples name them."""
    known = samples.dropna(subset=["rank"]).drop_duplicates("rank", keep="last")
    return known[["rank", "node", "replica"]].astype({"rank": int})


def _step_rows(steps: pd.DataFrame, collectives: pd.DataFrame) -> pd.DataFrame:
    """Completed steps, one observation per (attempt, step) at its first rank's time."""
    steps = steps.fillna({"attempt": 0}).astype({"step": int, "rank": int, "attempt": int})
    spent: dict[Any, float] = {}
    if not collectives.empty:
        table = collectives.fillna({"attempt": 0}).dropna(subset=["step", "rank"])
        durations = (table["exit_time"] - table["enter_time"]).groupby(
            [table["attempt"].astype(int), table["step"].astype(int), table["rank"].astype(int)]
        )
        spent = {key: float(value) for key, value in durations.sum().items()}
    # A step is observed when its first rank reported it: the stall detector counts each
    # rank's silence from its own last step, and a replay must not see less of it.
    done = steps[steps["name"] == "step_time"].groupby(["attempt", "step"])["time"].min()
    ended: dict[Any, float] = {key: float(value) for key, value in done.items()}
    rows: list[tuple[float, Any, Any, str, float]] = []
    for key, group in steps.groupby(_KEYS, sort=False):
        attempt, step, rank = key
        # Every reported value is kept, NaN included: a NaN loss is the fault itself.
        values = {
            str(name): float(value)
            for name, value in zip(group["name"], group["value"], strict=True)
            if not str(name).startswith("nonfinite.")
        }
        if "step_time" not in values:
            continue  # the rank never finished this step
        if key in spent:  # the hook's own figure wins: it counts overlaps once
            values.setdefault("collective_time", spent[key])
        time = ended[(attempt, step)]
        rows += [(time, step, rank, name, v) for name, v in peer_features(values).items()]
    return pd.DataFrame(rows, columns=["time", "step", "rank", "metric", "value"])


def _marker_rows(samples: pd.DataFrame) -> pd.DataFrame:
    """Reports of a rank waiting inside an open collective (1) and of its end (0), and the
    controller's looks at a stopped rank (``proc_stopped`` 1, and 0 when it runs again)."""
    marks = samples[samples["name"].isin(_OBSERVED) & samples["step"].notna()]
    return pd.DataFrame(
        {
            "time": marks["time"],
            "step": marks["step"].astype(int),
            "rank": marks["rank"].astype(int),
            "metric": marks["name"],
            "value": (marks["value"] > 0).astype(float),
        }
    )


def _exit_rows(events: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Process exits, on the step the rank was in (the one after its last report)."""
    exits = events[(events["phase"] == "exited") & events["subject"].str.startswith("rank:")]
    steps = steps.fillna({"attempt": 0})
    rows = []
    for event in exits.to_dict("records"):
        rank = int(str(event["subject"]).removeprefix("rank:"))
        detail = event["detail"]
        mine = steps[(steps["rank"] == rank) & (steps["attempt"] == event["attempt"])]
        step = int(mine["step"].max()) + 1 if not mine.empty else 0
        for metric, value in (
            ("exit_code", float(detail.get("exit_code", 0))),
            ("collateral", float(bool(detail.get("collateral")))),
        ):
            rows.append((float(event["time"]), step, rank, metric, value))
    return pd.DataFrame(rows, columns=["time", "step", "rank", "metric", "value"])


def _launch_rows(events: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Relaunches (``launched`` = 1), on the first step the new process reported: a
    replay gives a starting rank its start-up, as the live run did."""
    steps = steps.fillna({"attempt": 0})
    launches = events[(events["phase"] == "launch") & events["subject"].str.startswith("rank:")]
    rows = []
    for event in launches.to_dict("records"):
        rank = int(str(event["subject"]).removeprefix("rank:"))
        attempt = int(event["detail"].get("attempt", event["attempt"]))
        mine = steps[(steps["rank"] == rank) & (steps["attempt"] == attempt)]
        if attempt > 0 and not mine.empty:
            rows.append((float(event["time"]), int(mine["step"].min()), rank, "launched", 1.0))
    return pd.DataFrame(rows, columns=["time", "step", "rank", "metric", "value"])


def _recovery_rows(events: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """The moment the job was stopped to recover (``recovering`` = 1 on each rank still
    running): the last thing seen of an attempt that hung, so a replay sees its silence."""
    steps = steps.fillna({"attempt": 0})
    exits = events[events["phase"] == "exited"]
    rows = []
    for event in events[events["phase"] == "recovering"].to_dict("records"):
        attempt = steps[steps["attempt"] == event["attempt"]]
        gone = set(exits.loc[exits["attempt"] == event["attempt"], "subject"])
        for rank, mine in attempt.groupby("rank"):
            if f"rank:{int(rank)}" not in gone:
                step = int(mine["step"].max()) + 1
                rows.append((float(event["time"]), step, int(rank), "recovering", 1.0))
    return pd.DataFrame(rows, columns=["time", "step", "rank", "metric", "value"])


def _labels(faults: pd.DataFrame, injected: list[FaultSpec], last_step: int) -> list[FaultWindow]:
    """One window per fault that fired; a slowdown's length comes from the run's spec."""
    windows = []
    for fault in faults.to_dict("records"):
        kind = FAULT_FINDINGS.get(str(fault["kind"]))
        if kind is None or pd.isna(fault["step"]) or pd.isna(fault["rank"]):
            continue
        start, rank = int(fault["step"]), int(fault["rank"])
        end = start
        if fault["kind"] in ("slow", "slow_collective"):
            spans = [
                s.steps
                for s in injected
                if (s.kind, s.rank, s.step) == (fault["kind"], rank, start)
            ]
            end = start + spans[0] - 1 if spans and spans[0] else last_step
        windows.append(FaultWindow(kind, f"rank:{rank}", start, end))
    return windows


__all__ = ["FAULT_FINDINGS", "recorded_trace"]
