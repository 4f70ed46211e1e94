"""Prometheus alerting rules, generated: one per finding kind, and the classic GPU faults.

XID alerts look at ``changes()`` of the sticky last-XID gauge (dcgm-exporter's
``DCGM_FI_DEV_XID_ERRORS`` and Eagle Eye's ``eagleeye_gpu_xid_last``), never at its value
alone: the gauge keeps its last XID forever and cannot show two equal XIDs in a row. The
alert's value is the XID itself, so the webhook can put it in the finding's evidence.

Labels every alert carries: ``kind`` (the finding kind the webhook creates), ``severity``
(info, warn or critical) and ``remediate`` ("true" for alerts that should reach
remediation through Alertmanager; Eagle Eye's own findings are already remediated in the
controller, their alerts are for people).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from eagleeye.exporter import KNOWN_KINDS

# XIDs after which a GPU cannot be trusted: fell off the bus, double-bit ECC, contained and
# uncontained ECC, GSP timeout and error, recovery action required (FAULTS.md).
FATAL_XIDS = (48, 79, 94, 95, 119, 120, 154)
XID_METRICS = ("eagleeye_gpu_xid_last", "DCGM_FI_DEV_XID_ERRORS")


def _camel(kind: str) -> str:
    return "".join(part.capitalize() for part in kind.split("_"))


def finding_rule(kind: str, window: str = "1m") -> dict[str, Any]:
    """Fires while findings of ``kind`` keep arriving (counter increased in ``window``)."""
    return {
        "alert": f"EagleEye{_camel(kind)}",
        "expr": f'sum by (kind, severity) (increase(eagleeye_findings_total{{kind="{kind}"}}'
        f"[{window}])) > 0",
        "labels": {"remediate": "false", "source": "eagleeye"},
        "annotations": {
            "summary": f"Eagle Eye found {kind} ({{{{ $labels.severity }}}})",
            "description": "{{ $value }} findings in the last " + window,
            "value": "{{ $value }}",
        },
    }


def xid_rules(metric: str, window: str = "1m") -> list[dict[str, Any]]:
    """A fatal-XID rule (critical, remediated) and an other-XID rule (warn) for ``metric``."""
    fatal = " or ".join(f"{metric} == {xid}" for xid in FATAL_XIDS)
    changed = f"changes({metric}[{window}]) > 0"
    name = "Dcgm" if metric.startswith("DCGM") else "Gpu"
    common = {"summary": "XID {{ $value }} on GPU {{ $labels.gpu }}", "value": "{{ $value }}"}
    return [
        {
            "alert": f"{name}XidFatal",
            "expr": f"({fatal}) and {changed}",
            "labels": {"kind": "xid", "severity": "critical", "remediate": "true"},
            "annotations": common,
        },
        {
            "alert": f"{name}Xid",
            "expr": f"({metric} and {changed}) unless ({fatal})",
            "labels": {"kind": "xid", "severity": "warn", "remediate": "true"},
            "annotations": common,
        },
    ]


def gpu_rules(window: str = "1m") -> list[dict[str, Any]]:
    rules = [r for metric in XID_METRICS for r in xid_rules(metric, window)]
    rules.append(
        {
            "alert": "GpuTemperatureHigh",
            "expr": "eagleeye_gpu_temperature_celsius > 90",
            "for": "2m",  # throttling flaps: only a sustained temperature is worth a page
            "labels": {"kind": "thermal", "severity": "warn", "remediate": "false"},
            "annotations": {
                "summary": "GPU {{ $labels.gpu }} at {{ $value }} C",
                "value": "{{ $value }}",
            },
        }
    )
    return rules


def alert_rules(kinds: Iterable[str] = KNOWN_KINDS, window: str = "1m") -> dict[str, Any]:
    """The whole rule file: a group of finding alerts and a group of GPU alerts."""
    return {
        "groups": [
            {"name": "eagleeye-findings", "rules": [finding_rule(k, window) for k in kinds]},
            {"name": "eagleeye-gpu", "rules": gpu_rules(window)},
        ]
    }


def write_rules(path: str | Path, kinds: Iterable[str] = KNOWN_KINDS, window: str = "1m") -> Path:
    """Writes the rule file (JSON, which Prometheus reads as YAML) and returns its path."""
    path = Path(path)
    path.write_text(json.dumps(alert_rules(kinds, window), indent=2) + "\n", encoding="utf-8")
    return path
