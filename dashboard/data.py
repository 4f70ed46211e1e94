"""Data access for the pages: run-store queries behind st.cache_data.

Every loader takes the run folder as a string (the cache key) and opens a fresh reader, so
the pages see new rows while a run writes. Queries aggregate in SQLite, not in pandas, so
a run with millions of samples stays quick; the covering index of schema 4 answers the
per-metric queries from the index alone.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import streamlit as st

from dashboard import grid
from eagleeye.errors import EagleEyeError
from eagleeye.store import DB_NAME, RunReader, newest_run

ENV_RUN = "EAGLEEYE_DASHBOARD_RUN"
"""Run folder the dashboard shows first; unset means the newest under EAGLEEYE_RUNS_DIR."""
ENV_RUNS_DIR = "EAGLEEYE_RUNS_DIR"
"""Folder of run folders (default ./runs): the run picker lists them."""
TTL_S = 2.0

#: The detectors' per-rank features (detectors.edge, eagleeye.detection.peer_features), in
#: milliseconds, from the hook's samples in seconds: (SQL of one step of one rank, sources).
FEATURES: dict[str, str] = {
    "compute_ms": "1000 * max(0, max(CASE WHEN name = 'step_time' THEN value END) "
    "- coalesce(max(CASE WHEN name = 'section.checkpoint' THEN value END), 0) "
    "- coalesce(max(CASE WHEN name = 'collective_time' THEN value END), 0) "
    "- coalesce(max(CASE WHEN name = 'section.data' THEN value END), 0))",
    "data_wait_ms": "1000 * max(CASE WHEN name = 'section.data' THEN value END)",
    "comm_ms": "1000 * max(CASE WHEN name = 'collective_time' THEN value END)",
}
_FEATURE_SOURCES = ("step_time", "section.checkpoint", "collective_time", "section.data")


def selected_run() -> str:
    """The run to show first: the one named, else the newest; raises EagleEyeError if none."""
    named = os.environ.get(ENV_RUN)
    if named:
        return named
    return str(newest_run(runs_dir()))


def runs_dir() -> str:
    return os.environ.get(ENV_RUNS_DIR, "runs")


def available_runs() -> list[str]:
    """Every run folder under the runs folder and the named run, newest first."""
    found = {p.parent.resolve() for p in Path(runs_dir()).glob(f"*/{DB_NAME}")}
    named = os.environ.get(ENV_RUN)
    if named and (Path(named) / DB_NAME).exists():
        found.add(Path(named).resolve())
    return [str(p) for p in sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)]


def _query(run: str, sql: str, params: tuple[Any, ...] = ()) -> pd.DataFrame:
    with RunReader(run) as reader:
        return reader.query(sql, params)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def meta(run: str) -> dict[str, Any]:
    with RunReader(run) as reader:
        return reader.meta()


@st.cache_data(ttl=TTL_S, show_spinner=False)
def events(run: str) -> pd.DataFrame:
    with RunReader(run) as reader:
        return reader.events()


@st.cache_data(ttl=TTL_S, show_spinner=False)
def findings(run: str) -> pd.DataFrame:
    with RunReader(run) as reader:
        return reader.findings()


@st.cache_data(ttl=TTL_S, show_spinner=False)
def actions(run: str) -> pd.DataFrame:
    with RunReader(run) as reader:
        return reader.actions()


@st.cache_data(ttl=TTL_S, show_spinner=False)
def checkpoints(run: str) -> pd.DataFrame:
    return _query(run, "SELECT * FROM checkpoints ORDER BY time")


@st.cache_data(ttl=TTL_S, show_spinner=False)
def progress_samples(run: str) -> pd.DataFrame:
    """What the summary's ETTR and throughput read: every ``step_time`` and ``replicas``
    sample (time, step, attempt, rank, name, value), and the ``tokens`` samples as one
    row holding their sum. Read through numpy: half the time of pandas' SQL reader on the
    half million rows of a 512-rank, 1000-step run."""
    frames = [_numeric(run, name) for name in ("step_time", "replicas")]
    tokens = _query(
        run,
        "SELECT max(time) AS time, max(step) AS step, max(attempt) AS attempt, NULL AS rank, "
        "'tokens' AS name, sum(value) AS value FROM samples WHERE name = 'tokens' "
        "HAVING count(*) > 0",
    )
    return pd.concat([f for f in (*frames, tokens) if not f.empty], ignore_index=True)


def _numeric(run: str, name: str) -> pd.DataFrame:
    """Every sample of one metric: time, step, attempt, rank, name, value."""
    with RunReader(run) as reader:
        rows = reader.rows(
            "SELECT time, step, attempt, rank, value FROM samples WHERE name = ?", (name,)
        )
    table = np.array(rows, dtype=float).reshape(-1, 5)
    frame = pd.DataFrame(table, columns=["time", "step", "attempt", "rank", "value"])
    for column in ("step", "attempt", "rank"):
        frame[column] = frame[column].astype("Int64" if frame[column].isna().any() else int)
    frame.insert(4, "name", name)
    return frame


@st.cache_data(ttl=TTL_S, show_spinner=False)
def metric_names(run: str) -> list[str]:
    """The recorded metrics (an index skip-scan: one lookup per name, not per sample)."""
    frame = _query(
        run,
        """
        WITH RECURSIVE n(name) AS (
            SELECT min(name) FROM samples
            UNION ALL SELECT (SELECT min(name) FROM samples WHERE name > n.name) FROM n
            WHERE n.name IS NOT NULL)
        SELECT name FROM n WHERE name IS NOT NULL""",
    )
    return sorted(frame["name"])


def features(run: str) -> list[str]:
    """What the Ranks page offers: the detectors' features the run's samples give, then
    every recorded metric."""
    names = metric_names(run)
    derived = [f for f in FEATURES if "step_time" in names or f != "compute_ms"]
    derived = [f for f in derived if f != "data_wait_ms" or "section.data" in names]
    derived = [f for f in derived if f != "comm_ms" or "collective_time" in names]
    first = [n for n in ("step_time",) if n in names]
    return first + derived + [n for n in names if n not in first]


@st.cache_data(ttl=TTL_S, show_spinner=False)
def per_step(run: str, name: str) -> pd.DataFrame:
    """Mean, min and max over ranks of one metric per step (newest attempt per step)."""
    frame = _query(
        run,
        """
        SELECT attempt, step, avg(value) AS mean, min(value) AS min, max(value) AS max,
               max(time) AS time
        FROM samples WHERE name = ? GROUP BY attempt, step""",
        (name,),
    )
    newest = frame.sort_values(["step", "attempt"]).drop_duplicates("step", keep="last")
    return _finite(newest.drop(columns="attempt"), ["mean", "min", "max"])


def _finite(frame: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """Rows whose ``columns`` are all finite: a chart of an infinite or missing value has
    no extent (Vega warns and draws nothing)."""
    values = frame[columns].apply(pd.to_numeric, errors="coerce").to_numpy(dtype=float)
    kept: pd.DataFrame = frame.loc[np.isfinite(values).all(axis=1)]
    return kept.reset_index(drop=True)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def step_range(run: str) -> tuple[int, int] | None:
    frame = _query(
        run, "SELECT min(step) AS lo, max(step) AS hi FROM samples WHERE name = 'step_time'"
    )
    lo, hi = frame["lo"].iloc[0], frame["hi"].iloc[0]
    return None if pd.isna(lo) else (int(lo), int(hi))


@st.cache_data(ttl=TTL_S, show_spinner=False)
def rank_cells(run: str, name: str, ranks: int) -> pd.DataFrame:
    """Long (step, rank, value) of one metric or feature: steps bucketed so that the
    heatmap holds at most ``grid.MAX_CELLS`` cells, the worst (largest) value per bucket."""
    bounds = step_range(run)
    if bounds is None:
        return pd.DataFrame(columns=["step", "rank", "value"])
    lo, hi = bounds
    width = grid.step_width(hi - lo + 1, ranks)
    if name in FEATURES:
        marks = ", ".join("?" * len(_FEATURE_SOURCES))
        source = (
            f"SELECT rank, step, {FEATURES[name]} AS value FROM samples "
            f"WHERE name IN ({marks}) GROUP BY rank, step, attempt"
        )
        params: tuple[Any, ...] = _FEATURE_SOURCES
    else:
        source = "SELECT rank, step, value FROM samples WHERE name = ?"
        params = (name,)
    cells = _query(
        run,
        f"""
        SELECT rank, (step / {width}) * {width} AS step, max(value) AS value
        FROM ({source}) WHERE step IS NOT NULL AND rank IS NOT NULL GROUP BY rank, 2""",
        params,
    )
    return _finite(cells, ["value"])


def current_run() -> str:
    """The run the page shows; stops the page with a hint when there is none."""
    run = st.session_state.get("run")
    if not run:
        st.info("No run to show yet: start one with `eagleeye demo` or `eagleeye run`.")
        st.stop()
    return str(run)


def run_label(run: str) -> str:
    return Path(run).name


__all__ = ["ENV_RUN", "ENV_RUNS_DIR", "EagleEyeError", "available_runs", "selected_run"]
