"""Data access for the pages: run-store queries behind st.cache_data.

Every loader takes the run folder as a string (the cache key) and opens a fresh reader, so
the pages see new rows while a run writes. Queries aggregate in SQLite, not in pandas, so
a run with millions of samples stays quick.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from eagleeye.errors import EagleEyeError
from eagleeye.store import RunReader, newest_run

ENV_RUN = "EAGLEEYE_DASHBOARD_RUN"
"""Run folder the dashboard shows; unset means the newest under EAGLEEYE_RUNS_DIR."""
ENV_RUNS_DIR = "EAGLEEYE_RUNS_DIR"
"""Folder of run folders (default ./runs)."""
TTL_S = 2.0
MAX_HEATMAP_STEPS = 300


def selected_run() -> str:
    """The run to show: the one named, else the newest; raises EagleEyeError if none."""
    named = os.environ.get(ENV_RUN)
    if named:
        return named
    return str(newest_run(os.environ.get(ENV_RUNS_DIR, "runs")))


def _query(run: str, sql: str, params: tuple[Any, ...] = ()) -> pd.DataFrame:
    with RunReader(run) as reader:
        return reader.query(sql, params)


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
def samples(run: str, names: tuple[str, ...]) -> pd.DataFrame:
    marks = ", ".join("?" * len(names))
    return _query(
        run,
        f"SELECT time, step, attempt, rank, name, value FROM samples "
        f"WHERE name IN ({marks}) ORDER BY time",
        names,
    )


@st.cache_data(ttl=TTL_S, show_spinner=False)
def metric_names(run: str) -> list[str]:
    frame = _query(run, "SELECT DISTINCT name FROM samples")
    return sorted(frame["name"])


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
    return newest.drop(columns="attempt").reset_index(drop=True)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def heatmap(run: str, name: str) -> pd.DataFrame:
    """Long (step, rank, value) of one metric, steps bucketed to at most MAX_HEATMAP_STEPS.

    ``collective_time`` comes from the collectives table: the step's total time in
    collectives per rank.
    """
    if name == "collective_time":
        source = (
            "SELECT step, rank, sum(exit_time - enter_time) AS value FROM collectives "
            "WHERE step IS NOT NULL GROUP BY attempt, step, rank"
        )
        params: tuple[Any, ...] = ()
    else:
        source = "SELECT step, rank, value FROM samples WHERE name = ?"
        params = (name,)
    bounds = _query(run, f"SELECT min(step) AS lo, max(step) AS hi FROM ({source})", params)
    lo, hi = bounds["lo"].iloc[0], bounds["hi"].iloc[0]
    if pd.isna(lo):
        return pd.DataFrame(columns=["step", "rank", "value"])
    width = max(1, int((hi - lo) // MAX_HEATMAP_STEPS) + 1)
    return _query(
        run,
        f"""
        SELECT (step / {width}) * {width} AS step, rank, max(value) AS value
        FROM ({source}) GROUP BY 1, rank ORDER BY 1, rank""",
        params,
    )


def current_run() -> str:
    """The run the page shows; stops the page with a hint when there is none."""
    run = st.session_state.get("run")
    if not run:
        st.info("No run to show yet: start one with `eagleeye demo` or `eagleeye run`.")
        st.stop()
    return str(run)


def run_label(run: str) -> str:
    return Path(run).name


__all__ = ["ENV_RUN", "ENV_RUNS_DIR", "EagleEyeError", "selected_run"]
