"""Alerting: generated Prometheus rules, Alertmanager configuration and the webhook that
turns Alertmanager's alerts into findings for remediation."""

from __future__ import annotations

from eagleeye.alerting.alertmanager import alertmanager_config, write_alertmanager_config
from eagleeye.alerting.rules import FATAL_XIDS, alert_rules, write_rules
from eagleeye.alerting.webhook import AlertWebhook, alert_to_finding

__all__ = [
    "FATAL_XIDS",
    "AlertWebhook",
    "alert_rules",
    "alert_to_finding",
    "alertmanager_config",
    "write_alertmanager_config",
    "write_rules",
]
