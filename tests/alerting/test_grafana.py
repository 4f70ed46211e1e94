"""The generated Grafana dashboard: its JSON, its PromQL (checked by promtool), its metrics
(all emitted by the exporter), and the CLI. No Grafana server runs here: push is only
tested for its refusals."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from eagleeye import grafana
from eagleeye.cli import main
from eagleeye.errors import EagleEyeError
from tests.alerting.conftest import PROMTOOL, need
from tests.alerting.test_exporter import busy_exporter

pytestmark = pytest.mark.skipif(
    not grafana.is_available(), reason="the grafana extra is not installed"
)


def panels() -> list[dict]:
    return [p for p in grafana.build_dashboard("ds1")["panels"] if p["type"] != "row"]


def queries() -> list[str]:
    """Every PromQL of the board (panels and annotations), variables expanded to All."""
    board = grafana.build_dashboard("ds1")
    exprs = [e for _, e in grafana.panel_queries(board)]
    exprs += [a["expr"] for a in board["annotations"]["list"] if "expr" in a]
    return [grafana.expand(e) for e in exprs]


def test_the_dashboard_json_is_well_formed() -> None:
    board = grafana.build_dashboard("ds1")
    assert board["uid"] == grafana.DASHBOARD_UID
    assert board["schemaVersion"] >= 36
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    assert [p["title"] for p in board["panels"] if p["type"] == "row"] == [
        "Training",
        "Ranks",
        "GPUs (DCGM)",
        "Eagle Eye",
    ]
    cells = set()
    for p in board["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24
        cell = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not cells & cell, f"panel {p['title']} overlaps another"
        cells |= cell
    assert json.loads(grafana.dashboard_json()) == grafana.build_dashboard()


def test_the_datasource_is_a_variable_never_a_uid_in_a_panel() -> None:
    board = grafana.build_dashboard("ds1")
    for p in panels():
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert p["targets"]
        assert all(t["datasource"]["uid"] == "${datasource}" for t in p["targets"])
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["current"]["value"] == "ds1"  # only the default
    assert json.dumps(board).count('"ds1"') == 2  # the default's text and value


def test_variables_for_job_run_host_and_rank_chain() -> None:
    board = grafana.build_dashboard()
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert list(variables) == ["datasource", "job", "run", "host", "rank"]
    assert "$job" in variables["run"]["definition"]
    assert "$run" in variables["host"]["definition"]
    assert "$host" in variables["rank"]["definition"]
    for name in ("job", "run", "host", "rank"):
        assert variables[name]["includeAll"]
        assert variables[name]["datasource"]["uid"] == "${datasource}"
    exprs = [e for _, e in grafana.panel_queries(board)]
    assert all("$job" in e and "$run" in e for e in exprs if "eagleeye_rank_" in e)
    assert all("$rank" in e for e in exprs if "eagleeye_rank_step_time" in e)
    assert all("$host" in e for e in exprs if e.startswith(("DCGM_", "increase(DCGM")))


def test_findings_and_actions_are_annotations() -> None:
    ours = [a for a in grafana.build_dashboard()["annotations"]["list"] if "expr" in a]
    assert [a["name"] for a in ours] == ["Findings", "Actions"]
    assert "eagleeye_findings_total" in ours[0]["expr"]
    assert "eagleeye_actions_total" in ours[1]["expr"]
    assert all(a["datasource"]["uid"] == "${datasource}" for a in ours)


def test_gpu_panels_use_dcgm_names() -> None:
    gpu = [e for t, e in grafana.panel_queries(grafana.build_dashboard()) if "DCGM_" in e]
    names = {m for e in gpu for m in re.findall(r"DCGM_FI_DEV_\w+", e)}
    assert {"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_XID_ERRORS"} <= names


def test_every_query_is_valid_promql(tmp_path: Path) -> None:
    rules = {
        "groups": [
            {
                "name": "g",
                "rules": [
                    {"record": f"dashboard:q{i}", "expr": e} for i, e in enumerate(queries())
                ],
            }
        ]
    }
    (tmp_path / "q.yml").write_text(json.dumps(rules))
    checked = subprocess.run(
        [need(PROMTOOL, "promtool"), "check", "rules", str(tmp_path / "q.yml")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_every_metric_on_the_dashboard_is_exported() -> None:
    text = busy_exporter().text().decode()
    # Names from TYPE lines too: a labelled gauge with no series yet still exists.
    exported = set(re.findall(r"^((?:eagleeye|DCGM)_\w+?)(?:\{| )", text, re.M))
    exported |= set(re.findall(r"^# TYPE ((?:eagleeye|DCGM)_\w+) ", text, re.M))
    used = {m for e in queries() for m in re.findall(r"(?:eagleeye|DCGM)_\w+", e)}
    assert used <= exported, used - exported


def test_cli_exports_and_push_refuses_without_a_token(tmp_path, capsys, monkeypatch) -> None:
    out = tmp_path / "board.json"
    assert main(["grafana", "export", "-o", str(out), "--datasource", "ds9"]) == 0
    board = json.loads(out.read_text())
    assert board["templating"]["list"][0]["current"]["value"] == "ds9"
    monkeypatch.delenv("EAGLEEYE_GRAFANA_TOKEN", raising=False)
    assert main(["grafana", "push", "--url", "http://127.0.0.1:9"]) == 2
    assert "needs a Grafana URL and an API token" in capsys.readouterr().err
    with pytest.raises(EagleEyeError, match="needs a Grafana URL"):
        grafana.push("", "t", {})
