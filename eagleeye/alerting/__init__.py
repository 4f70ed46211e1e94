"""Alerting: generated Prometheus rules and their unit tests, Alertmanager configuration,
and the webhook that turns Alertmanager's alerts into findings for remediation."""

from __future__ import annotations

from eagleeye.alerting.alertmanager import (
    alertmanager_config,
    read_token_file,
    write_alertmanager_config,
    write_token_file,
)
from eagleeye.alerting.rules import FATAL_XIDS, Windows, alert_names, alert_rules, write_rules
from eagleeye.alerting.ruletest import run_rule_tests, untested_alerts
from eagleeye.alerting.webhook import (
    AlertWebhook,
    alert_to_finding,
    decode_alerts,
    findings_of,
    severity_of,
)

__all__ = [
    "FATAL_XIDS",
    "AlertWebhook",
    "Windows",
    "alert_names",
    "alert_rules",
    "alert_to_finding",
    "alertmanager_config",
    "decode_alerts",
    "findings_of",
    "read_token_file",
    "run_rule_tests",
    "severity_of",
    "untested_alerts",
    "write_alertmanager_config",
    "write_rules",
    "write_token_file",
]
