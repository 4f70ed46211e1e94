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


def test_the_dashboard_json_is_well_formed() -> None:
    board = grafana.build_dashboard("ds1")
    assert board["uid"] == grafana.DASHBOARD_UID
    assert board["schemaVersion"] >= 36
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    assert [p["title"] for p in board["panels"] if p["type"] == "row"] == [
        "Training",
        "Ranks",
        "GPUs",
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
    for p in panels():
        assert p["datasource"] == {"type": "prometheus", "uid": "ds1"}
        assert p["targets"]
        assert all(t["datasource"]["uid"] == "ds1" for t in p["targets"])
    assert json.loads(grafana.dashboard_json()) == grafana.build_dashboard()


def test_every_query_is_valid_promql(tmp_path: Path) -> None:
    exprs = [t["expr"] for p in panels() for t in p["targets"]]
    rules = {
        "groups": [
            {
                "name": "g",
                "rules": [{"record": f"dashboard:q{i}", "expr": e} for i, e in enumerate(exprs)],
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
    exported = set(re.findall(r"^(eagleeye_\w+?)(?:\{| )", text, re.M))
    exported |= set(re.findall(r"^# TYPE (eagleeye_\w+) ", text, re.M))
    used = {
        m for p in panels() for t in p["targets"] for m in re.findall(r"eagleeye_\w+", t["expr"])
    }
    assert used <= exported, used - exported


def test_cli_exports_and_push_refuses_without_a_token(tmp_path, capsys, monkeypatch) -> None:
    out = tmp_path / "board.json"
    assert main(["grafana", "export", "-o", str(out), "--datasource", "ds9"]) == 0
    assert json.loads(out.read_text())["panels"][1]["datasource"]["uid"] == "ds9"
    monkeypatch.delenv("EAGLEEYE_GRAFANA_TOKEN", raising=False)
    assert main(["grafana", "push", "--url", "http://127.0.0.1:9"]) == 2
    assert "needs a Grafana URL and an API token" in capsys.readouterr().err
    with pytest.raises(EagleEyeError, match="needs a Grafana URL"):
        grafana.push("", "t", {})
