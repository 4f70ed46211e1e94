"""Every page of the dashboard on a recorded run, through Streamlit's AppTest."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

import dashboard

APP = str(Path(dashboard.__file__).parent / "streamlit_app.py")
pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def open_page(monkeypatch, run: Path, page: str | None = None) -> AppTest:
    monkeypatch.setenv("EAGLEEYE_DASHBOARD_RUN", str(run))
    at = AppTest.from_file(APP, default_timeout=60)
    at.session_state["live"] = False
    at.run()
    if page is not None:
        at.switch_page(page)
        at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_overview_shows_job_health_and_the_rank_grid(monkeypatch, recorded_run) -> None:
    at = open_page(monkeypatch, recorded_run)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["job"] == "succeeded"
    assert metrics["current step"] == "23"
    assert metrics["ETTR"].endswith("%")
    grid = at.dataframe[0].value
    assert sorted(grid["rank"]) == [0, 1, 2, 3]
    assert set(grid["health"]) == {"ok"}  # the kill was in attempt 0; all recovered


def test_ranks_page_has_heatmaps_for_steps_sections_and_collectives(
    monkeypatch, recorded_run
) -> None:
    at = open_page(monkeypatch, recorded_run, "app_pages/ranks.py")
    options = at.selectbox[0].options
    assert "step_time" in options
    assert "section.forward" in options
    assert "collective_time" in options
    at.selectbox[0].set_value("collective_time").run()
    assert not at.exception
    assert at.selectbox[1].options == ["0", "1", "2", "3"]


def test_training_findings_actions_and_checkpoints_pages(monkeypatch, recorded_run) -> None:
    at = open_page(monkeypatch, recorded_run, "app_pages/training.py")
    assert [s.value for s in at.subheader][:2] == ["loss", "gradient norm"]
    at = open_page(monkeypatch, recorded_run, "app_pages/findings.py")
    table = at.dataframe[0].value
    assert list(table["kind"]) == ["process_exit"]
    assert '"signal": 9.0' in table["evidence"].iloc[0]
    at.button[0].click().run()  # opens the rank in the Ranks view
    assert not at.exception
    at = open_page(monkeypatch, recorded_run, "app_pages/actions.py")
    trail = at.dataframe[0].value
    assert list(trail["finding"]) == ["process_exit on rank 3"]
    assert list(trail["status"]) == ["done"]
    at = open_page(monkeypatch, recorded_run, "app_pages/checkpoints.py")
    assert "PERSISTENT" in set(at.dataframe[0].value["state"])


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
