"""Prometheus alerting rules, generated: alerts that are states, on Eagle Eye's and DCGM's names.

A state alert fires while its condition holds and resolves when it stops: a training that
makes no step fires for as long as it is stuck and resolves on the first step after.
XID alerts look at ``changes()`` of the sticky last-XID gauge ``DCGM_FI_DEV_XID_ERRORS``
(dcgm-exporter's, and Eagle Eye's under the same name), never at its value alone: the
gauge keeps its last XID for ever, and a reset to 0 is no fault. Which XIDs are fatal
comes from the one catalogue, collector.xid.

Labels every alert carries: ``kind`` (the finding kind the webhook creates), ``severity``
(``info``, ``warning`` or ``critical``) and ``remediate`` ("true" for alerts that should
reach remediation through Alertmanager; Eagle Eye's own findings are already remediated in
the controller, their alerts are for people). Every alert has a ``runbook_url``
annotation, ``<runbooks>/<alert>.md`` (docs/runbooks/), and a summary naming the job, the
host and the rank where it has them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collector.xid import XID_CATALOGUE

#: XIDs after which a GPU cannot be trusted, from the catalogue (collector.xid).
FATAL_XIDS = tuple(sorted(c for c, i in XID_CATALOGUE.items() if i.severity == "fatal"))
#: XIDs that follow another error and need nothing of their own.
INFO_XIDS = tuple(sorted(c for c, i in XID_CATALOGUE.items() if i.severity == "info"))
XID_METRIC = "DCGM_FI_DEV_XID_ERRORS"
RUN = "job, instance, run"  # what tells two jobs apart: the scrape job and Eagle Eye's run
RUNBOOKS = "docs/runbooks"
_JOB = "job {{ $labels.job }} run {{ $labels.run }} ({{ $labels.instance }})"
_GPU = (
    "GPU {{ $labels.gpu }} on {{ $labels.Hostname }} "
    "(job {{ $labels.job }}{{ with $labels.run }}, run {{ . }}{{ end }})"
)
_RANK = "Rank {{ $labels.rank }} on {{ $labels.hostname }} ({{ $labels.node }})"
_WHERE = "replica, node, hostname, gpu, uuid"  # what eagleeye_rank_info adds to a rank


@dataclass(frozen=True, slots=True)
class Windows:
    """The time ranges of the rules; short ones make tests and demos quick.

    Attributes:
        stall: no step for this long is a stalled training or rank.
        change: the range of ``changes()`` and ``increase()`` for events (XID, ECC, findings).
        sustain: how long a slow rank or a hot GPU must last before it is an alert.
        down: how long a scrape target must be down.
        absent: how long a series must be missing.
    """

    stall: str = "2m"
    change: str = "2m"
    sustain: str = "5m"
    down: str = "1m"
    absent: str = "10m"


def _rule(
    alert: str,
    expr: str,
    kind: str | None,
    severity: str | None,
    summary: str,
    remediate: bool = False,
    for_: str | None = None,
    value: bool = True,
    runbooks: str = RUNBOOKS,
) -> dict[str, Any]:
    annotations = {"summary": summary, "runbook_url": f"{runbooks}/{alert}.md"}
    if value:
        annotations["value"] = "{{ $value }}"
    labels = {"kind": kind, "severity": severity}  # None: the series' own label stands
    rule: dict[str, Any] = {
        "alert": alert,
        "expr": expr,
        "labels": {
            **{k: v for k, v in labels.items() if v is not None},
            "remediate": str(remediate).lower(),
            "source": "eagleeye",
        },
        "annotations": annotations,
    }
    if for_:
        rule["for"] = for_
    return rule


def _codes(codes: tuple[int, ...]) -> str:
    return " or ".join(f"{XID_METRIC} == {code}" for code in codes)


def training_rules(w: Windows, runbooks: str = RUNBOOKS) -> list[dict[str, Any]]:
    """Stalled training (the job) and stalled or slow ranks: states, from the exporter."""
    rank_steps = f"increase(eagleeye_rank_steps_total[{w.stall}])"
    active = f"on ({RUN}) eagleeye_run_active == 1"
    info = f"on ({RUN}, rank) group_left ({_WHERE}) eagleeye_rank_info"
    hostname = 'label_replace({0}, "Hostname", "$1", "hostname", "(.*)")'
    compute = f"avg_over_time(eagleeye_rank_compute_seconds[{w.sustain}])"
    median = f"on ({RUN}) group_left quantile by ({RUN}) (0.5, {compute})"
    return [
        _rule(
            "EagleEyeTrainingStalled",
            f"sum by ({RUN}) ({rank_steps}) == 0 and {active}",
            "hang",
            "critical",
            f"No rank of {_JOB} completed a step in {w.stall}",
            value=False,
            runbooks=runbooks,
        ),
        _rule(
            "EagleEyeRankStalled",
            hostname.format(
                f"({rank_steps} == 0) * {info}"
                f" and on ({RUN}) sum by ({RUN}) ({rank_steps}) > 0 and {active}"
            ),
            "hang",
            "critical",
            f"{_RANK} of {_JOB} made no step in {w.stall} while others train",
            value=False,
            runbooks=runbooks,
        ),
        _rule(
            "EagleEyeRankStopped",
            hostname.format(f'eagleeye_rank_progress{{state=~"stopped|blocked"}} * {info}'),
            "hang",
            "critical",
            f"{_RANK} of job {{{{ $labels.job }}}} run {{{{ $labels.run }}}} is "
            "{{ $labels.state }}: its process does not run (the culprit of a hang)",
            for_=w.stall,
            value=False,
            runbooks=runbooks,
        ),
        _rule(
            "EagleEyeRankSlow",
            hostname.format(f"({compute} / {median} > 1.5) * {info}"),
            "slow_rank",
            "warning",
            f"{_RANK} of {_JOB} computes {{{{ $value | humanize }}}}x slower than the median rank",
            for_=w.sustain,
            runbooks=runbooks,
        ),
        _rule(
            "EagleEyeFindings",
            f'sum by ({RUN}, kind, severity) (increase(eagleeye_findings_total{{kind!~".*hang",'
            f'severity!="info"}}[{w.change}])) > 0',
            None,  # the finding's kind and severity, from the counter
            None,
            "Eagle Eye found {{ $labels.kind }} ({{ $labels.severity }}) in " + _JOB,
            value=False,
            runbooks=runbooks,
        ),
    ]


def health_rules(w: Windows, runbooks: str = RUNBOOKS) -> list[dict[str, Any]]:
    """Targets down and series missing: what makes every other rule blind."""
    return [
        _rule(
            "ScrapeTargetDown",
            "up == 0",
            "target_down",
            "warning",
            "Prometheus cannot scrape {{ $labels.instance }} (job {{ $labels.job }})",
            for_=w.down,
            value=False,
            runbooks=runbooks,
        ),
        _rule(
            "EagleEyeMetricsAbsent",
            "absent(eagleeye_run_active)",
            "target_down",
            "warning",
            "No Eagle Eye run is scraped: no exporter, or runs without --metrics-port",
            for_=w.absent,
            value=False,
            runbooks=runbooks,
        ),
        _rule(
            "EagleEyeNoRankTelemetry",
            f"eagleeye_run_active == 1 unless on ({RUN}) eagleeye_rank_steps_total",
            "telemetry",
            "warning",
            f"{_JOB} has run for {w.absent} without a step from any rank",
            for_=w.absent,
            value=False,
            runbooks=runbooks,
        ),
        _rule(
            "DcgmMetricsAbsent",
            "absent(DCGM_FI_DEV_GPU_TEMP)",
            "target_down",
            "warning",
            "No GPU metrics (dcgm-exporter or --gpu-metrics nvml) are scraped",
            for_=w.absent,
            value=False,
            runbooks=runbooks,
        ),
    ]


def gpu_rules(w: Windows, runbooks: str = RUNBOOKS) -> list[dict[str, Any]]:
    """XIDs from the catalogue, ECC, row remapping, throttling and NVLink, on DCGM names."""
    changed = f"changes({XID_METRIC}[{w.change}]) > 0"
    nvlink = " or ".join(
        f"increase(DCGM_FI_DEV_NVLINK_{name}_ERROR_COUNT_TOTAL[{w.change}]) > 0"
        for name in ("CRC_FLIT", "CRC_DATA", "REPLAY", "RECOVERY")
    )
    return [
        _rule(
            "GpuXidFatal",
            f"({_codes(FATAL_XIDS)}) and {changed}",
            "xid",
            "critical",
            f"Fatal XID {{{{ $value }}}} on {_GPU}",
            remediate=True,
            runbooks=runbooks,
        ),
        _rule(
            "GpuXid",
            f"({XID_METRIC} > 0 unless ({_codes(FATAL_XIDS + INFO_XIDS)})) and {changed}",
            "xid",
            "warning",
            f"XID {{{{ $value }}}} on {_GPU}",
            remediate=True,
            runbooks=runbooks,
        ),
        _rule(
            "GpuEccDoubleBitErrors",
            f"increase(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL[{w.change}]) > 0",
            "gpu_memory",
            "critical",
            f"Double-bit ECC errors on {_GPU}: drain it",
            value=False,
            runbooks=runbooks,
        ),
        _rule(
            "GpuRowRemapFailure",
            "DCGM_FI_DEV_ROW_REMAP_FAILURE > 0",
            "gpu_memory",
            "critical",
            f"Row remapping failed on {_GPU}: its memory cannot be repaired",
            value=False,
            runbooks=runbooks,
        ),
        _rule(
            "GpuUncorrectableRowsRemapped",
            f"increase(DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS[{w.change}]) > 0",
            "gpu_memory",
            "warning",
            f"Rows remapped for uncorrectable errors on {_GPU}: reset it to apply the remap",
            value=False,
            runbooks=runbooks,
        ),
        _rule(
            "GpuThermalThrottling",
            # bits 0x20 and 0x40 of the clock-event reasons: software and hardware thermal
            "floor(DCGM_FI_DEV_CLOCK_THROTTLE_REASONS / 32) % 4 > 0",
            "thermal",
            "warning",
            f"{_GPU} is throttled for heat",
            for_=w.sustain,
            value=False,
            runbooks=runbooks,
        ),
        _rule(
            "GpuTemperatureHigh",
            "DCGM_FI_DEV_GPU_TEMP > 90",
            "thermal",
            "warning",
            f"{_GPU} at {{{{ $value }}}} C",
            for_=w.sustain,
            runbooks=runbooks,
        ),
        _rule(
            "GpuNvlinkErrors",
            nvlink,
            "nvlink",
            "warning",
            f"NVLink errors on {_GPU}",
            value=False,
            runbooks=runbooks,
        ),
    ]


def alert_rules(windows: Windows | None = None, runbooks: str = RUNBOOKS) -> dict[str, Any]:
    """The whole rule file: training, health and GPU groups."""
    w = windows or Windows()
    return {
        "groups": [
            {"name": "eagleeye-training", "rules": training_rules(w, runbooks)},
            {"name": "eagleeye-health", "rules": health_rules(w, runbooks)},
            {"name": "eagleeye-gpu", "rules": gpu_rules(w, runbooks)},
        ]
    }


def alert_names() -> list[str]:
    """Every alert the rules define (each has a runbook page)."""
    return [r["alert"] for g in alert_rules()["groups"] for r in g["rules"]]


def write_rules(path: str | Path, windows: Windows | None = None, runbooks: str = RUNBOOKS) -> Path:
    """Writes the rule file (JSON, which Prometheus reads as YAML) and returns its path."""
    path = Path(path)
    text = json.dumps(alert_rules(windows, runbooks), indent=2) + "\n"
    path.write_text(text, encoding="utf-8")
    return path
