"""Grafana dashboards generated as code (grafana-foundation-sdk), pushed with grafana-client.

Both libraries sit in the ``grafana`` extra; without them ``is_available()`` is False and
building or pushing raises a clear error. Every panel queries the metrics of
``eagleeye.exporter`` (GPU panels: dcgm-exporter's names, so they read dcgm-exporter or
``eagleeye run --gpu-metrics nvml`` alike) through the ``$datasource`` variable: no data
source uid is written into a panel, the one given is only the variable's default.

Variables: ``datasource``, ``job`` (Prometheus's scrape job), ``run`` (Eagle Eye's run
id), ``host`` and ``rank`` (from ``eagleeye_rank_info``), each depending on the ones before.
Findings and actions are drawn as annotations.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from eagleeye.errors import EagleEyeError

try:
    from grafana_foundation_sdk.builders import dashboard as gdash
    from grafana_foundation_sdk.builders import prometheus as gprom
    from grafana_foundation_sdk.builders import stat as gstat
    from grafana_foundation_sdk.builders import timeseries as gts
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import DataSourceRef
except ImportError:  # the grafana extra is not installed
    gdash = None  # type: ignore[assignment]

DASHBOARD_UID = "eagleeye-training"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
RUN = 'job=~"$job",run=~"$run"'  # a run's series
RANK = f'{RUN},rank=~"$rank"'  # a rank's series (ranks are those of the chosen hosts)
GPU = 'Hostname=~"$host"'  # dcgm-exporter's series have no run: the hosts choose them
_GPU_LEGEND = "{{Hostname}}/{{gpu}}"
_RANK_LEGEND = "{{run}} rank {{rank}}"
# (row, [(title, unit, [(PromQL, legend)])]); stat panels are marked with unit "stat:<unit>".
PANELS: list[tuple[str, list[tuple[str, str, list[tuple[str, str]]]]]] = [
    (
        "Training",
        [
            ("Loss", "none", [(f"eagleeye_training_loss{{{RUN}}}", "{{run}} replica {{replica}}")]),
            (
                "Steps per second",
                "short",
                [(f"rate(eagleeye_steps_total{{{RUN}}}[1m])", "{{run}}")],
            ),
            (
                "Tokens per second",
                "short",
                [(f"rate(eagleeye_tokens_total{{{RUN}}}[1m])", "{{run}}")],
            ),
            ("ETTR", "stat:percentunit", [(f"eagleeye_ettr_ratio{{{RUN}}}", "{{run}}")]),
            (
                "Step time p50 / p95 (all ranks)",
                "s",
                [
                    (
                        f"histogram_quantile({q}, sum by (job, run, le) "
                        f"(rate(eagleeye_step_time_seconds_bucket{{{RUN}}}[1m])))",
                        f"{{{{run}}}} p{int(q * 100)}",
                    )
                    for q in (0.5, 0.95)
                ],
            ),
            (
                "Learning rate",
                "none",
                [(f"eagleeye_training_learning_rate{{{RUN}}}", "{{run}}")],
            ),
        ],
    ),
    (
        "Ranks",
        [
            ("Step time", "s", [(f"eagleeye_rank_step_time_seconds{{{RANK}}}", _RANK_LEGEND)]),
            ("Compute", "s", [(f"eagleeye_rank_compute_seconds{{{RANK}}}", _RANK_LEGEND)]),
            (
                "Data wait",
                "s",
                [(f"eagleeye_rank_data_wait_seconds{{{RANK}}}", _RANK_LEGEND)],
            ),
            (
                "Collective wait",
                "s",
                [(f"eagleeye_rank_collective_wait_seconds{{{RANK}}}", _RANK_LEGEND)],
            ),
            (
                "Slowest rank's compute vs the median",
                "none",
                [
                    (
                        f"max by (job, run) (eagleeye_rank_compute_seconds{{{RUN}}}) / "
                        f"quantile by (job, run) (0.5, eagleeye_rank_compute_seconds{{{RUN}}})",
                        "{{run}}",
                    )
                ],
            ),
            (
                "Ranks by state",
                "short",
                [
                    (
                        f"count by (run, state) (eagleeye_rank_progress{{{RANK}}})",
                        "{{run}} {{state}}",
                    )
                ],
            ),
            (
                "Seconds since the rank's last step",
                "s",
                [
                    (
                        f"time() - eagleeye_rank_last_step_timestamp_seconds{{{RANK}}}",
                        _RANK_LEGEND,
                    )
                ],
            ),
        ],
    ),
    (
        "GPUs (DCGM)",
        [
            ("Temperature", "celsius", [(f"DCGM_FI_DEV_GPU_TEMP{{{GPU}}}", _GPU_LEGEND)]),
            ("Utilisation", "percent", [(f"DCGM_FI_DEV_GPU_UTIL{{{GPU}}}", _GPU_LEGEND)]),
            ("Power", "watt", [(f"DCGM_FI_DEV_POWER_USAGE{{{GPU}}}", _GPU_LEGEND)]),
            ("Framebuffer used", "decmbytes", [(f"DCGM_FI_DEV_FB_USED{{{GPU}}}", _GPU_LEGEND)]),
            ("SM clock", "megahertz", [(f"DCGM_FI_DEV_SM_CLOCK{{{GPU}}}", _GPU_LEGEND)]),
            ("Last XID", "none", [(f"DCGM_FI_DEV_XID_ERRORS{{{GPU}}}", _GPU_LEGEND)]),
            (
                "XID events (5m)",
                "none",
                [
                    (
                        f"increase(eagleeye_gpu_xid_events_total{{{GPU}}}[5m])",
                        "{{Hostname}}/{{gpu}} xid {{xid}}",
                    )
                ],
            ),
            (
                "Double-bit ECC errors (5m)",
                "none",
                [(f"increase(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{GPU}}}[5m])", _GPU_LEGEND)],
            ),
            (
                "NVLink errors (5m)",
                "none",
                [
                    (
                        f"increase(DCGM_FI_DEV_NVLINK_{name}_ERROR_COUNT_TOTAL{{{GPU}}}[5m])",
                        f"{_GPU_LEGEND} {name.lower()}",
                    )
                    for name in ("CRC_FLIT", "CRC_DATA", "REPLAY", "RECOVERY")
                ],
            ),
            (
                "Thermal throttling",
                "none",
                [
                    (
                        f"floor(DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{{{GPU}}} / 32) % 4 > bool 0",
                        _GPU_LEGEND,
                    )
                ],
            ),
        ],
    ),
    (
        "Eagle Eye",
        [
            (
                "Findings by kind (5m)",
                "short",
                [
                    (
                        f"sum by (run, kind) (increase(eagleeye_findings_total{{{RUN}}}[5m]))",
                        "{{run}} {{kind}}",
                    )
                ],
            ),
            (
                "Actions by kind and outcome (1h)",
                "short",
                [
                    (
                        "sum by (run, kind, status) "
                        f"(increase(eagleeye_actions_total{{{RUN}}}[1h]))",
                        "{{run}} {{kind}} {{status}}",
                    )
                ],
            ),
            (
                "Checkpoints by state",
                "stat:short",
                [(f"eagleeye_checkpoints{{{RUN}}}", "{{run}} {{state}}")],
            ),
            (
                "Newest checkpoint step",
                "stat:short",
                [(f"eagleeye_checkpoint_last_step{{{RUN}}}", "{{run}}")],
            ),
            ("Attempt", "stat:short", [(f"eagleeye_run_attempt{{{RUN}}}", "{{run}}")]),
            (
                "Pending approvals",
                "stat:short",
                [(f"eagleeye_pending_approvals{{{RUN}}}", "{{run}}")],
            ),
        ],
    ),
]
#: (name, label, query, the variables it depends on): chained, each filtered by the ones before.
VARIABLES = [
    ("job", "Job", "label_values(eagleeye_run_active, job)"),
    ("run", "Run", 'label_values(eagleeye_run_active{job=~"$job"}, run)'),
    ("host", "Host", f"label_values(eagleeye_rank_info{{{RUN}}}, hostname)"),
    ("rank", "Rank", f'label_values(eagleeye_rank_info{{{RUN},hostname=~"$host"}}, rank)'),
]
#: (name, colour, PromQL, title) of the annotations: a finding or action where its counter rose.
ANNOTATIONS = [
    (
        "Findings",
        "red",
        f"changes(eagleeye_findings_total{{{RUN}}}[1m]) > 0",
        "{{kind}} ({{severity}}) in {{run}}",
    ),
    (
        "Actions",
        "blue",
        f"changes(eagleeye_actions_total{{{RUN}}}[1m]) > 0",
        "{{kind}}: {{status}} in {{run}}",
    ),
]


def is_available() -> bool:
    """Whether the ``grafana`` extra (grafana-foundation-sdk, grafana-client) is installed."""
    return gdash is not None


def _require() -> None:
    if gdash is None:
        raise EagleEyeError(
            "Grafana dashboards need the grafana extra: pip install 'eagleeye[grafana]'"
        )


def _panel(title: str, unit: str, queries: list[tuple[str, str]], ds: Any) -> Any:
    builder = gstat.Panel() if unit.startswith("stat:") else gts.Panel()
    builder = builder.title(title).unit(unit.removeprefix("stat:")).datasource(ds).span(8)
    for ref, (expr, legend) in zip("ABCDEFGH", queries, strict=False):
        builder = builder.with_target(
            gprom.Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(ds)
        )
    return builder.height(8)


def _templating(default_uid: str) -> dict[str, Any]:
    datasource = {
        "name": "datasource",
        "label": "Data source",
        "type": "datasource",
        "query": "prometheus",
        "current": {"text": default_uid, "value": default_uid},
        "hide": 0,
        "refresh": 1,
        "regex": "",
        "options": [],
    }
    queries: list[dict[str, Any]] = [
        {
            "name": name,
            "label": label,
            "type": "query",
            "datasource": DATASOURCE,
            "definition": query,
            "query": {"query": query, "refId": f"{name}-values"},
            "refresh": 2,  # on time range change: new runs and ranks appear
            "includeAll": True,
            "multi": True,
            "current": {"text": ["All"], "value": ["$__all"]},
            "sort": 3 if name == "rank" else 1,  # ranks numerically
            "hide": 0,
            "regex": "",
            "options": [],
        }
        for name, label, query in VARIABLES
    ]
    return {"list": [datasource, *queries]}


def _annotations() -> dict[str, Any]:
    builtin = {
        "builtIn": 1,
        "datasource": {"type": "grafana", "uid": "-- Grafana --"},
        "enable": True,
        "hide": True,
        "iconColor": "rgba(0, 211, 255, 1)",
        "name": "Annotations & Alerts",
        "type": "dashboard",
    }
    ours = [
        {
            "name": name,
            "datasource": DATASOURCE,
            "enable": True,
            "hide": False,
            "iconColor": colour,
            "expr": expr,
            "step": "15s",
            "titleFormat": title,
            "tagKeys": "run,kind",
            "textFormat": "",
            "useValueForTime": False,
        }
        for name, colour, expr, title in ANNOTATIONS
    ]
    return {"list": [builtin, *ours]}


def build_dashboard(datasource_uid: str = "prometheus") -> dict[str, Any]:
    """The training dashboard as Grafana JSON (a plain dict).

    Args:
        datasource_uid: the default of the ``$datasource`` variable (panels use the
            variable, never this uid).
    """
    _require()
    ds = DataSourceRef(type_val="prometheus", uid=DATASOURCE["uid"])
    board = (
        gdash.Dashboard("Eagle Eye: training")
        .uid(DASHBOARD_UID)
        .tags(["eagleeye", "training"])
        .refresh("10s")
        .time("now-1h", "now")
        .timezone("browser")
    )
    for row, panels in PANELS:
        board = board.with_row(gdash.Row(row))
        for title, unit, queries in panels:
            board = board.with_panel(_panel(title, unit, queries, ds))
    result: dict[str, Any] = json.loads(json.dumps(board.build(), cls=JSONEncoder))
    # The builders leave ids unset; Grafana wants them unique to link and repeat panels.
    for number, panel in enumerate(result["panels"], start=1):
        panel["id"] = number
    result["templating"] = _templating(datasource_uid)
    result["annotations"] = _annotations()
    return result


def dashboard_json(datasource_uid: str = "prometheus") -> str:
    return json.dumps(build_dashboard(datasource_uid), indent=2, sort_keys=True) + "\n"


def panel_queries(board: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(panel title, PromQL)`` of every query of every panel."""
    return [
        (panel["title"], target["expr"])
        for panel in board["panels"]
        for target in panel.get("targets", [])
    ]


def expand(expr: str, values: Mapping[str, str] | None = None) -> str:
    """A query with the dashboard's variables replaced (``$run`` -> ``values["run"]``; a
    variable not given is "All", ``.*``), as Grafana sends it to Prometheus."""
    given = values or {}
    return re.sub(
        r"\$(\w+)",
        lambda m: given.get(m.group(1), ".*") if m.group(1) != "__all" else ".*",
        expr,
    )


def push(url: str, token: str, dashboard: dict[str, Any], folder_uid: str | None = None) -> Any:
    """Creates or overwrites the dashboard on a Grafana server with grafana-client.

    Raises:
        EagleEyeError: no URL or token, the extra is missing, or Grafana refused it.
    """
    _require()
    if not url or not token:
        raise EagleEyeError("pushing needs a Grafana URL and an API token (--url, --token)")
    from grafana_client.api import GrafanaApi

    payload: dict[str, Any] = {"dashboard": dashboard, "overwrite": True}
    if folder_uid:
        payload["folderUid"] = folder_uid
    try:
        return GrafanaApi.from_url(url, credential=token).dashboard.update_dashboard(payload)
    except Exception as exc:  # grafana-client raises its own and niquests' errors
        raise EagleEyeError(f"Grafana at {url} refused the dashboard: {exc}") from exc
