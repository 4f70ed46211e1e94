"""The labelled trace format: long rows of telemetry plus JSON fault windows.

Rows: ``time, step, job, replica, node, rank, metric, value`` (CSV or Parquet). Rows of one
observation share its ``(step, time)``; rows completing one step may lie within
``SNAP_SHARE`` of the median step time (ranks that stamp their rows with their own
clock); several observations may share a step (heartbeats of a job stuck on that step).
Metric names may be any alias of collector.vocabulary (``DCGM_FI_DEV_GPU_TEMP``,
``gpu_temp_c``, ``step_time_ms``): they are read in canonical names and units. Labels: a
JSON list of ``{kind, subject, start_step, end_step}``, where ``subject`` is
``"rank:<n>"``, ``"node:<name>"``, ``"replica:<n>"`` or ``"job"``. See
docs/trace-format.md.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from collector.types import Subject
from collector.vocabulary import canonical_name, scale_of
from detectors.errors import DetectorError
from detectors.eval._csvcheck import integers, numbers, read_csv_checked
from detectors.stepbatch import StepBatch

COLUMNS = ("time", "step", "job", "replica", "node", "rank", "metric", "value")
#: Rows completing one step (with a ``step_time``) stamped within this share of the median
#: step time of the first of them are one observation, unless a rank's metric would appear
#: in it twice: the ranks of a synchronous job end a step together, but each may stamp its
#: rows with its own clock.
SNAP_SHARE = 0.1


@dataclass(frozen=True, slots=True)
class FaultWindow:
    """One labelled fault: its class, where it is, and its first and last step."""

    kind: str
    subject: str
    start_step: int
    end_step: int

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "subject": self.subject,
            "start_step": self.start_step,
            "end_step": self.end_step,
        }


def subject_label(subject: Subject) -> str:
    """The label spelling of a subject: rank beats node beats replica beats job."""
    if subject.rank is not None:
        return f"rank:{subject.rank}"
    if subject.node is not None:
        return f"node:{subject.node}"
    if subject.replica is not None:
        return f"replica:{subject.replica}"
    return "job"


@dataclass(frozen=True, eq=False)
class Trace:
    """A trace in array form: ``values[t, r, m]`` of tick t, rank row r, metric m.

    ``present`` tells reported values (a NaN loss) from missing ones.
    """

    job: str
    ranks: np.ndarray
    nodes: np.ndarray
    replicas: np.ndarray
    metrics: tuple[str, ...]
    steps: np.ndarray
    times: np.ndarray
    values: np.ndarray
    present: np.ndarray
    labels: tuple[FaultWindow, ...] = ()

    @property
    def node_days(self) -> float:
        """Nodes times the trace's duration in days: the exposure for false-alarm rates."""
        duration = float(self.times[-1] - self.times[0]) if len(self.times) > 1 else 0.0
        return len(set(self.nodes.tolist())) * duration / 86400.0

    def batches(self) -> Iterator[StepBatch]:
        for t in range(len(self.steps)):
            yield StepBatch(
                int(self.steps[t]),
                float(self.times[t]),
                self.ranks,
                self.nodes,
                self.replicas,
                self.metrics,
                self.values[t],
                self.present[t],
            )

    def to_long(self) -> pd.DataFrame:
        """The trace as long rows (only reported values)."""
        t_idx, r_idx, m_idx = np.nonzero(self.present)
        return pd.DataFrame(
            {
                "time": self.times[t_idx],
                "step": self.steps[t_idx],
                "job": self.job,
                "replica": self.replicas[r_idx],
                "node": self.nodes[r_idx],
                "rank": self.ranks[r_idx],
                "metric": np.array(self.metrics)[m_idx],
                "value": self.values[t_idx, r_idx, m_idx],
            }
        )

    @classmethod
    def from_long(cls, rows: pd.DataFrame, labels: Sequence[FaultWindow] = ()) -> Trace:
        """Builds the array form from long rows (one job).

        Raises:
            DetectorError: a column is missing or the rows hold several jobs.
        """
        missing = [c for c in COLUMNS if c not in rows.columns]
        if missing:
            raise DetectorError(f"trace lacks column(s) {missing}; expected {list(COLUMNS)}")
        jobs = rows["job"].astype(str).unique()
        if len(jobs) > 1:
            raise DetectorError(
                f"trace holds {len(jobs)} jobs ({', '.join(jobs[:3])}, ...); "
                "split it into one trace per job"
            )
        rows = _canonical_rows(rows)
        rank_info = rows.drop_duplicates("rank").sort_values("rank")
        row_of = {r: i for i, r in enumerate(rank_info["rank"])}
        metrics = tuple(sorted(rows["metric"].astype(str).unique()))
        metric_of = {m: i for i, m in enumerate(metrics)}
        r = rows["rank"].map(row_of).to_numpy()
        m = rows["metric"].astype(str).map(metric_of).to_numpy()
        t, tick_steps, tick_times = _observations(
            rows["step"].to_numpy(),
            rows["time"].to_numpy(dtype=float),
            r * len(metrics) + m,
            (rows["metric"] == "step_time").to_numpy(dtype=float),
        )
        shape = (len(tick_steps), len(rank_info), len(metrics))
        values, present = np.full(shape, np.nan), np.zeros(shape, dtype=bool)
        values[t, r, m] = rows["value"].to_numpy(dtype=float)
        present[t, r, m] = True
        return cls(
            str(jobs[0]) if len(jobs) else "job",
            rank_info["rank"].to_numpy(dtype=int),
            rank_info["node"].astype(str).to_numpy(dtype=object),
            rank_info["replica"].to_numpy(dtype=int),
            metrics,
            tick_steps,
            tick_times,
            values,
            present,
            tuple(labels),
        )


def step_seconds(steps: np.ndarray, times: np.ndarray) -> float | None:
    """The median time from a step's first observation to the next step's (observations in
    time order): observations that repeat a step (GPU scrapes, heartbeats) do not shorten
    it. None without two steps."""
    starts = np.r_[True, np.diff(steps) > 0]
    gaps = np.diff(times[starts])
    gaps = gaps[gaps > 0]
    return float(np.median(gaps)) if len(gaps) else None


def _observations(
    steps: np.ndarray, times: np.ndarray, cells: np.ndarray, completes: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each row's observation, and the observations' steps and times, in time order.

    ``cells`` numbers each row's rank and metric; ``completes`` marks its ``step_time``
    rows. The ``(step, time)`` pairs that complete one step and lie within ``SNAP_SHARE``
    of the median step time of the first of them are one observation, stamped with the
    latest of their times (when it is whole), unless one of its cells would come twice (a
    job stuck on a step sends its heartbeats as observations of their own). Other pairs
    (GPUs scraped on each node's own schedule) stay observations of their own: merged,
    they would set nodes of different pipeline stages side by side now and then.
    """
    pairs = pd.DataFrame({"step": steps, "time": times}).drop_duplicates()
    pairs = pairs.sort_values(["step", "time"], kind="stable")
    at = pd.MultiIndex.from_frame(pairs).get_indexer(pd.MultiIndex.from_arrays([steps, times]))
    by_time = pairs.sort_values(["time", "step"], kind="stable")
    step_s = step_seconds(by_time["step"].to_numpy(), by_time["time"].to_numpy())
    by_pair = np.argsort(at, kind="stable")
    bounds = np.searchsorted(at[by_pair], np.arange(len(pairs) + 1))
    cells_of = [cells[by_pair[a:b]] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    bears = np.bincount(at, weights=completes, minlength=len(pairs)) > 0
    group = _snapped(pairs, cells_of, bears, SNAP_SHARE * step_s if step_s else 0.0)
    merged = pairs.groupby(group).agg(step=("step", "first"), time=("time", "max"))
    order = np.lexsort((merged["step"].to_numpy(), merged["time"].to_numpy()))
    tick_of_group = np.empty(len(order), dtype=np.int64)
    tick_of_group[order] = np.arange(len(order))
    return (
        tick_of_group[group[at]],
        merged["step"].to_numpy(dtype=int)[order],
        merged["time"].to_numpy(dtype=float)[order],
    )


def _snapped(
    pairs: pd.DataFrame, cells_of: list[np.ndarray], bears: np.ndarray, snap: float
) -> np.ndarray:
    """The observation of each ``(step, time)`` pair (sorted by step, then time), given the
    cells each pair carries and whether it completes the step."""
    group = np.empty(len(pairs), dtype=np.int64)
    k, step, start, taken, bearing = -1, None, 0.0, set[int](), False
    pair_steps, pair_times = pairs["step"].to_numpy(), pairs["time"].to_numpy()
    for i, (s, t) in enumerate(zip(pair_steps, pair_times, strict=True)):
        mine = cells_of[i].tolist()
        joins = bearing and bears[i] and s == step and t - start <= snap
        if not (joins and taken.isdisjoint(mine)):
            k, step, start, taken, bearing = k + 1, s, t, set(), bool(bears[i])
        taken.update(mine)
        group[i] = k
    return group


def _canonical_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """Metric names and values in the canonical vocabulary (collector.vocabulary).

    A trace may name a metric as DCGM or NVML does, or in another unit; where a rank reports
    one metric under its canonical name and an alias in the same observation, the canonical
    row wins.
    """
    raw = rows["metric"].astype(str)
    names = raw.unique()
    canon = {n: canonical_name(n) for n in names}
    if all(canon[n] == n for n in names):
        return rows
    rows = rows.assign(
        metric=raw.map(canon),
        value=rows["value"].to_numpy(dtype=float) * raw.map(scale_of).to_numpy(dtype=float),
        _alias=(raw != raw.map(canon)).to_numpy(),
    )
    rows = rows.sort_values("_alias", ascending=False, kind="stable")
    rows = rows.drop_duplicates(["step", "time", "rank", "metric"], keep="last")
    return rows.drop(columns="_alias")


def write_trace(trace: Trace, path: Path) -> None:
    """Writes rows to ``path`` (.csv or .parquet) and labels to ``<stem>.labels.json``."""
    rows = trace.to_long()
    if path.suffix == ".parquet":
        rows.to_parquet(path, index=False)
    else:
        rows.to_csv(path, index=False)
    _labels_beside(path).write_text(json.dumps([w.to_json() for w in trace.labels], indent=1))


_COMPRESSED = (".gz", ".bz2", ".xz", ".zst", ".zip")


def labels_path(path: Path) -> Path:
    """``<stem>.labels.json`` beside the trace: its name without the format's suffix
    (``.csv``, ``.parquet``, after a compression suffix), dots in the stem kept
    (``s1_m0.3.parquet`` → ``s1_m0.3.labels.json``). A labels file named by the name's
    first dot only, as earlier versions wrote it, is still found."""
    labels, legacy = _labels_beside(path), path.with_name(path.name.split(".")[0] + ".labels.json")
    return legacy if not labels.is_file() and legacy.is_file() else labels


def _labels_beside(path: Path) -> Path:
    name = path.name
    if name.endswith(_COMPRESSED):
        name = name.rsplit(".", 1)[0]
    stem = name.rsplit(".", 1)[0] if "." in name else name
    return path.with_name(stem + ".labels.json")


def read_trace(path: Path, labels: Path | None = None) -> Trace:
    """Reads a trace file and its labels (``<stem>.labels.json`` beside it, if present).

    Raises:
        DetectorError: the file is missing, unreadable, or not in the trace format.
    """
    if not path.is_file():
        raise DetectorError(f"trace file {path} not found")
    if path.suffix == ".parquet":
        try:
            rows = pd.read_parquet(path)
        except ImportError:
            raise DetectorError(
                "reading Parquet needs pyarrow: pip install 'eagleeye[eval]'"
            ) from None
        except (OSError, ValueError) as exc:
            raise DetectorError(f"cannot read trace {path}: {exc}") from None
        missing = [c for c in COLUMNS if c not in rows.columns]
        if missing:
            raise DetectorError(f"trace lacks column(s) {missing}; expected {list(COLUMNS)}")
        if rows.empty:
            raise DetectorError(f"{path} has no rows")
        rows = rows.astype({c: str for c in COLUMNS})
    else:
        rows = read_csv_checked(path, COLUMNS)
    rows = _typed_rows(rows, str(path))
    label_file = labels or labels_path(path)
    return Trace.from_long(rows, read_labels(label_file) if label_file.is_file() else ())


def _typed_rows(rows: pd.DataFrame, where: str) -> pd.DataFrame:
    """Trace rows with every cell checked: finite times, integer steps, ranks and replicas,
    numeric values (NaN allowed: a diverged metric is data) and metric names."""
    metric = rows["metric"].astype(str)
    empty = (metric.str.strip() == "").to_numpy()
    if empty.any():
        line = int(np.flatnonzero(empty)[0]) + 2
        raise DetectorError(f"{where}: line {line}, column 'metric': the metric name is empty")
    return pd.DataFrame(
        {
            "time": numbers(rows, "time", where),
            "step": integers(rows, "step", where),
            "job": rows["job"].astype(str).to_numpy(),
            "replica": integers(rows, "replica", where),
            "node": rows["node"].astype(str).to_numpy(),
            "rank": integers(rows, "rank", where),
            "metric": metric.to_numpy(),
            "value": numbers(rows, "value", where, finite=False),
        }
    )


def read_labels(path: Path) -> tuple[FaultWindow, ...]:
    """Reads a labels JSON file.

    Raises:
        DetectorError: the file is not a JSON list of well-formed windows.
    """
    try:
        data = json.loads(path.read_text())
        windows = tuple(
            FaultWindow(str(w["kind"]), str(w["subject"]), int(w["start_step"]), int(w["end_step"]))
            for w in data
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DetectorError(
            f"bad labels file {path}: {exc}; expected a JSON list of "
            "{kind, subject, start_step, end_step}"
        ) from None
    for w in windows:
        if w.end_step < w.start_step:
            raise DetectorError(f"{path}: window {w} ends before it starts")
    return windows


__all__ = [
    "COLUMNS",
    "FaultWindow",
    "Trace",
    "read_labels",
    "read_trace",
    "subject_label",
    "write_trace",
]
