"""Every page of the dashboard on real runs, through Streamlit's AppTest: what a person
reads (the job's state, the culprit of a hang, the summary's ETTR, readable times)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

import dashboard
from eagleeye.summary import summarize

APP = str(Path(dashboard.__file__).parent / "streamlit_app.py")
pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
UTC_TIME = r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}$"


def open_page(monkeypatch, run: Path, page: str | None = None) -> AppTest:
    monkeypatch.setenv("EAGLEEYE_DASHBOARD_RUN", str(run))
    monkeypatch.setenv("EAGLEEYE_RUNS_DIR", str(run.parent))
    at = AppTest.from_file(APP, default_timeout=60)
    at.session_state["live"] = False
    at.run()
    if page is not None:
        at.switch_page(page)
        at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_overview_shows_the_summarys_figures_and_the_recovered_rank(
    monkeypatch, recorded_run
) -> None:
    at = open_page(monkeypatch, recorded_run)
    metrics = {m.label: m.value for m in at.metric}
    summary = summarize(str(recorded_run))
    assert metrics["job"] == "succeeded"
    assert metrics["current step"] == "23"
    assert metrics["ETTR"] == f"{summary.ettr:.1%}"
    assert metrics["steps/s"] == f"{summary.steps_per_s:.2f}"
    assert metrics["tokens/s"] == f"{summary.tokens_per_s:,.0f}"
    grid = at.dataframe[0].value
    assert sorted(grid["rank"]) == [0, 1, 2, 3]
    health = dict(zip(grid["rank"], grid["health"], strict=True))
    assert health == {0: "ok", 1: "ok", 2: "ok", 3: "recovered"}  # killed, then stepped


def test_a_live_hang_shows_no_progress_and_names_the_culprit(monkeypatch, hung_run) -> None:
    at = open_page(monkeypatch, hung_run)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["job"] == "hung"
    assert metrics["steps/s, last 30 s"] == "0.00"
    assert "culprit **rank 1**" in at.error[0].value
    grid = at.dataframe[0].value
    health = dict(zip(grid["rank"], grid["health"], strict=True))
    assert health == {0: "waiting", 1: "hung", 2: "waiting", 3: "waiting"}
    assert dict(zip(grid["rank"], grid["progress"], strict=True))[1] == "stopped"


def test_ranks_page_offers_the_detectors_features_and_sorts_by_host_and_score(
    monkeypatch, recorded_run
) -> None:
    at = open_page(monkeypatch, recorded_run, "app_pages/ranks.py")
    options = at.selectbox(key="metric").options
    assert options[0] == "step_time"
    assert {"compute_ms", "data_wait_ms", "comm_ms", "section.forward", "loss"} <= set(options)
    at.selectbox(key="metric").set_value("compute_ms").run()
    assert not at.exception
    outliers = at.dataframe[0].value
    assert list(outliers["score"]) == sorted(outliers["score"], reverse=True)
    assert sorted(at.selectbox(key="rank").options) == ["0", "1", "2", "3"]


def test_tables_read_as_dates_sizes_and_whole_evidence(monkeypatch, recorded_run) -> None:
    at = open_page(monkeypatch, recorded_run, "app_pages/training.py")
    assert [s.value for s in at.subheader][:2] == ["loss", "gradient norm"]
    at = open_page(monkeypatch, recorded_run, "app_pages/findings.py")
    table = at.dataframe[0].value
    assert list(table["kind"]) == ["process_exit"]
    assert table["time (UTC)"].str.match(UTC_TIME).all()
    evidence = json.loads(table["evidence"].iloc[0])
    assert json.loads(at.json[0].value) == evidence  # the whole evidence, not a cut
    assert evidence["signal"] == 9.0
    at.button[0].click().run()  # opens the rank in the Ranks view
    assert not at.exception
    at = open_page(monkeypatch, recorded_run, "app_pages/actions.py")
    trail = at.dataframe[0].value
    assert list(trail["finding"]) == ["process_exit on rank 3"]
    assert list(trail["status"]) == ["done"]
    at = open_page(monkeypatch, recorded_run, "app_pages/checkpoints.py")
    ckpts = at.dataframe[0].value
    assert "PERSISTENT" in set(ckpts["state"])
    assert ckpts["size"].str.match(r"^(\d+(\.\d)? (B|KiB|MiB|GiB))?$").all()
    assert ckpts["time (UTC)"].str.match(UTC_TIME).all()


def test_run_picker_and_comparison_of_two_runs(monkeypatch, recorded_run, hung_run) -> None:
    # Two runs in different folders: the picker lists the named run and its folder's runs.
    at = open_page(monkeypatch, recorded_run, "app_pages/compare.py")
    assert "Only one run" in at.info[0].value
    monkeypatch.setenv("EAGLEEYE_RUNS_DIR", str(hung_run.parent))
    monkeypatch.setenv("EAGLEEYE_DASHBOARD_RUN", str(recorded_run))
    at = AppTest.from_file(APP, default_timeout=60)
    at.session_state["live"] = False
    at.run()
    picker = at.selectbox(key="run_choice")
    assert {Path(r).name for r in picker.options} == {"recorded", "hung"}
    assert Path(picker.value).name == "recorded"  # the named run first
    at.switch_page("app_pages/compare.py").run()
    assert not at.exception
    table = at.dataframe[0].value
    assert list(table.columns) == ["recorded", "hung"]
    assert table.loc["job"].tolist() == ["succeeded", "hung"]
    assert table.loc["ETTR", "recorded"] == f"{summarize(str(recorded_run)).ettr:.1%}"
    at.selectbox(key="run_choice").set_value(str(hung_run.resolve())).run()
    at.switch_page("app_pages/overview.py").run()
    assert {m.label: m.value for m in at.metric}["job"] == "hung"


def test_planner_page_simulates_and_recommends(monkeypatch, recorded_run) -> None:
    at = open_page(monkeypatch, recorded_run, "app_pages/planner.py")
    assert at.title[0].value == "Planner"
    assert at.success[0].value.startswith("Recommended: **")
    table = at.dataframe[0].value
    assert {"ckpt", "replication", "spare"} <= set(table["strategy"])


def test_no_run_is_a_hint_not_an_error(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("EAGLEEYE_DASHBOARD_RUN", raising=False)
    monkeypatch.setenv("EAGLEEYE_RUNS_DIR", str(tmp_path))
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    assert not at.exception
    assert "eagleeye demo" in at.info[0].value
