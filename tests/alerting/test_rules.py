"""The generated rules and Alertmanager configuration, checked by Prometheus's own tools:
promtool runs the shipped unit tests (which see every rule fire), amtool checks the config."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from collector.xid import XID_CATALOGUE
from eagleeye.alerting import (
    FATAL_XIDS,
    alert_names,
    alert_rules,
    run_rule_tests,
    untested_alerts,
    write_alertmanager_config,
    write_rules,
    write_token_file,
)
from eagleeye.alerting.rules import Windows
from eagleeye.cli import main
from eagleeye.errors import EagleEyeError
from tests.alerting.conftest import AMTOOL, PROMTOOL, need

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=30)


def rules() -> list[dict]:
    return [r for g in alert_rules()["groups"] for r in g["rules"]]


def test_the_shipped_unit_tests_pass_and_see_every_rule_fire() -> None:
    need(PROMTOOL, "promtool")
    assert untested_alerts() == []
    result = run_rule_tests()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_eagleeye_alerts_test_runs_them(capsys) -> None:
    need(PROMTOOL, "promtool")
    assert main(["alerts", "test"]) == 0
    assert "SUCCESS" in capsys.readouterr().out


def test_promtool_checks_rules_written_with_other_windows(tmp_path: Path) -> None:
    path = write_rules(tmp_path / "rules.yml", Windows(stall="20s", change="30s"), "https://x/rb")
    checked = run(need(PROMTOOL, "promtool"), "check", "rules", str(path))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    exprs = [r["expr"] for g in json.loads(path.read_text())["groups"] for r in g["rules"]]
    assert any("[20s]" in e for e in exprs)


def test_every_alert_has_a_runbook_a_severity_and_a_summary() -> None:
    for rule in rules():
        name = rule["alert"]
        assert rule["annotations"]["runbook_url"] == f"docs/runbooks/{name}.md"
        page = ROOT / "docs" / "runbooks" / f"{name}.md"
        text = page.read_text()
        for section in ("## What it means", "## What Eagle Eye does", "## What the operator does"):
            assert section in text, f"{page.name} lacks {section}"
        assert rule["labels"].get("severity", "warning") in ("info", "warning", "critical")
        assert rule["annotations"]["summary"]
    pages = {p.stem for p in (ROOT / "docs" / "runbooks").glob("*.md")}
    assert pages == set(alert_names())


def test_summaries_name_the_job_and_where() -> None:
    by_name = {r["alert"]: r for r in rules()}
    for name in ("EagleEyeTrainingStalled", "EagleEyeRankStalled", "EagleEyeRankSlow"):
        summary = by_name[name]["annotations"]["summary"]
        assert "$labels.job" in summary
        assert "$labels.run" in summary
    for name in ("EagleEyeRankStalled", "EagleEyeRankSlow"):
        summary = by_name[name]["annotations"]["summary"]
        assert "$labels.rank" in summary
        assert "$labels.hostname" in summary
    assert "$labels.Hostname" in by_name["GpuXidFatal"]["annotations"]["summary"]
    # Two jobs never share an alert: every training rule keeps job, instance and run.
    assert "sum by (job, instance, run)" in by_name["EagleEyeTrainingStalled"]["expr"]


def test_one_xid_catalogue_for_collector_and_rules() -> None:
    fatal = {code for code, info in XID_CATALOGUE.items() if info.severity == "fatal"}
    assert set(FATAL_XIDS) == fatal
    assert 74 in FATAL_XIDS
    assert 0 not in FATAL_XIDS
    by_name = {r["alert"]: r for r in rules()}
    assert "DCGM_FI_DEV_XID_ERRORS > 0" in by_name["GpuXid"]["expr"]  # XID 0 is no fault


def test_amtool_accepts_the_config_and_routes_by_remediate(tmp_path: Path) -> None:
    amtool = need(AMTOOL, "amtool")
    token = write_token_file(tmp_path / "alert.token")
    assert token.stat().st_mode & 0o077 == 0
    path = write_alertmanager_config(
        tmp_path / "am.yml",
        webhook_url="http://127.0.0.1:9/alerts",
        credentials_file=token,
        notify_url="http://127.0.0.1:9/people",
    )
    config = json.loads(path.read_text())
    auth = config["receivers"][0]["webhook_configs"][0]["http_config"]["authorization"]
    assert auth == {"type": "Bearer", "credentials_file": str(token.resolve())}
    assert token.read_text().strip() not in path.read_text()  # the config holds no secret
    assert config["inhibit_rules"][0]["equal"] == ["Hostname"]
    assert config["inhibit_rules"][0]["target_matchers"] == ['severity=~"warning|info"']
    assert {"job", "run", "Hostname"} <= set(config["route"]["group_by"])
    checked = run(amtool, "check-config", str(path))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    routed = run(amtool, "config", "routes", "test", f"--config.file={path}", "remediate=true")
    assert routed.stdout.strip() == "eagleeye-remediation,eagleeye-notify"
    routed = run(amtool, "config", "routes", "test", f"--config.file={path}", "remediate=false")
    assert routed.stdout.strip() == "eagleeye-notify"


def test_bad_alertmanager_settings_are_refused(tmp_path: Path) -> None:
    with pytest.raises(EagleEyeError, match="must start with http"):
        write_alertmanager_config(tmp_path / "a.yml", webhook_url="ftp://x", credentials_file="t")
    write_token_file(tmp_path / "t")
    with pytest.raises(EagleEyeError, match="exists"):
        write_token_file(tmp_path / "t")


def test_cli_writes_rules_and_a_config_naming_a_new_token_file(tmp_path, capsys) -> None:
    assert main(["alerts", "rules", "-o", str(tmp_path / "r.yml"), "--stall", "30s"]) == 0
    groups = json.loads((tmp_path / "r.yml").read_text())["groups"]
    assert [g["name"] for g in groups] == ["eagleeye-training", "eagleeye-health", "eagleeye-gpu"]
    args = ["alerts", "alertmanager", "-o", str(tmp_path / "a.yml")]
    args += ["--webhook-url", "http://h/alerts", "--token-file", str(tmp_path / "tok")]
    assert main(args) == 2  # no token file yet: one clear error
    assert "cannot read token file" in capsys.readouterr().err
    assert main([*args, "--new-token"]) == 0
    config = json.loads((tmp_path / "a.yml").read_text())
    auth = config["receivers"][0]["webhook_configs"][0]["http_config"]["authorization"]
    assert auth["credentials_file"] == str((tmp_path / "tok").resolve())
