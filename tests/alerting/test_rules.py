"""The generated rules and Alertmanager configuration, checked by Prometheus's own tools."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from eagleeye.alerting import alert_rules, write_alertmanager_config, write_rules
from eagleeye.errors import EagleEyeError
from eagleeye.exporter import KNOWN_KINDS
from tests.alerting.conftest import AMTOOL, PROMTOOL, need


def xid_alert(name: str, severity: str, gpu: str, xid: str) -> dict:
    return {
        "exp_labels": {
            "alertname": name,
            "kind": "xid",
            "severity": severity,
            "remediate": "true",
            "node": "n1",
            "gpu": gpu,
        },
        "exp_annotations": {"summary": f"XID {xid} on GPU {gpu}", "value": xid},
    }


UNIT_TESTS = {
    "rule_files": ["rules.yml"],
    "evaluation_interval": "15s",
    "tests": [
        {
            "interval": "15s",
            "input_series": [
                # The sticky gauge: 0, then XID 79 which it keeps for ever.
                {"series": 'eagleeye_gpu_xid_last{node="n1",gpu="0"}', "values": "0 0 0 0 79x12"},
                {"series": 'eagleeye_gpu_xid_last{node="n1",gpu="1"}', "values": "0 0 0 0 43x12"},
                {
                    "series": 'eagleeye_findings_total{kind="slow_rank",severity="warn"}',
                    "values": "0 0 1 2 2x12",
                },
                {
                    "series": 'eagleeye_gpu_temperature_celsius{node="n1",gpu="2"}',
                    "values": "95x20",
                },
            ],
            "alert_rule_test": [
                {
                    "eval_time": "1m",
                    "alertname": "GpuXidFatal",
                    "exp_alerts": [xid_alert("GpuXidFatal", "critical", "0", "79")],
                },
                {
                    "eval_time": "1m",
                    "alertname": "GpuXid",
                    "exp_alerts": [xid_alert("GpuXid", "warn", "1", "43")],
                },
                # Two minutes on, the gauge still reads 79 but nothing changed: no alert.
                {"eval_time": "3m", "alertname": "GpuXidFatal", "exp_alerts": []},
                {"eval_time": "3m", "alertname": "GpuXid", "exp_alerts": []},
                {
                    "eval_time": "1m",
                    "alertname": "EagleEyeSlowRank",
                    "exp_alerts": [
                        {
                            "exp_labels": {
                                "kind": "slow_rank",
                                "severity": "warn",
                                "remediate": "false",
                                "source": "eagleeye",
                            },
                            "exp_annotations": {
                                "summary": "Eagle Eye found slow_rank (warn)",
                                "description": "2 findings in the last 1m",
                                "value": "2",
                            },
                        }
                    ],
                },
                {"eval_time": "4m", "alertname": "EagleEyeSlowRank", "exp_alerts": []},
                {"eval_time": "1m", "alertname": "GpuTemperatureHigh", "exp_alerts": []},
                {
                    "eval_time": "3m",
                    "alertname": "GpuTemperatureHigh",
                    "exp_alerts": [
                        {
                            "exp_labels": {
                                "kind": "thermal",
                                "severity": "warn",
                                "remediate": "false",
                                "node": "n1",
                                "gpu": "2",
                            },
                            "exp_annotations": {"summary": "GPU 2 at 95 C", "value": "95"},
                        }
                    ],
                },
            ],
        }
    ],
}


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=30)


def test_every_finding_kind_has_an_alert() -> None:
    rules = alert_rules()["groups"][0]["rules"]
    assert [r["labels"]["source"] for r in rules] == ["eagleeye"] * len(KNOWN_KINDS)
    assert {r["expr"].split('kind="')[1].split('"')[0] for r in rules} == set(KNOWN_KINDS)


def test_promtool_checks_and_unit_tests_the_rules(tmp_path: Path) -> None:
    promtool = need(PROMTOOL, "promtool")
    write_rules(tmp_path / "rules.yml")
    checked = run(promtool, "check", "rules", str(tmp_path / "rules.yml"))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    (tmp_path / "tests.yml").write_text(json.dumps(UNIT_TESTS))
    tested = run(promtool, "test", "rules", str(tmp_path / "tests.yml"))
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_amtool_accepts_the_config_and_routes_by_remediate(tmp_path: Path) -> None:
    amtool = need(AMTOOL, "amtool")
    path = write_alertmanager_config(
        tmp_path / "am.yml",
        webhook_url="http://127.0.0.1:9/alerts",
        token="t0ken",
        notify_url="http://127.0.0.1:9/people",
    )
    assert path.stat().st_mode & 0o077 == 0  # it holds the token
    checked = run(amtool, "check-config", str(path))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    routed = run(amtool, "config", "routes", "test", f"--config.file={path}", "remediate=true")
    assert routed.stdout.strip() == "eagleeye-remediation,eagleeye-notify"
    routed = run(amtool, "config", "routes", "test", f"--config.file={path}", "remediate=false")
    assert routed.stdout.strip() == "eagleeye-notify"


def test_bad_alertmanager_settings_are_refused(tmp_path: Path) -> None:
    with pytest.raises(EagleEyeError, match="needs a token"):
        write_alertmanager_config(tmp_path / "a.yml", webhook_url="http://x", token="")
    with pytest.raises(EagleEyeError, match="must start with http"):
        write_alertmanager_config(tmp_path / "a.yml", webhook_url="ftp://x", token="t")
