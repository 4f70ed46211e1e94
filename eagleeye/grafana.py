"""Grafana dashboards generated as code (grafana-foundation-sdk), pushed with grafana-client.

Both libraries sit in the ``grafana`` extra; without them ``is_available()`` is False and
building or pushing raises a clear error. Every panel queries the metrics of
``eagleeye.exporter`` through a Prometheus data source whose uid is a parameter.
"""

from __future__ import annotations

import json
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
_GPU_LEGEND = "{{Hostname}}/{{gpu}}"
# (row, [(title, unit, [(PromQL, legend)])]); stat panels are marked with unit "stat:<unit>".
PANELS: list[tuple[str, list[tuple[str, str, list[tuple[str, str]]]]]] = [
    (
        "Training",
        [
            ("Loss", "none", [("eagleeye_training_loss", "replica {{replica}}")]),
            ("Step", "none", [("eagleeye_training_step", "replica {{replica}}")]),
            ("Learning rate", "none", [("eagleeye_training_learning_rate", "lr")]),
        ],
    ),
    (
        "Ranks",
        [
            ("Step time per rank", "s", [("eagleeye_rank_step_time_seconds", "rank {{rank}}")]),
            (
                "Slowest rank vs median",
                "percentunit",
                [
                    (
                        "max(eagleeye_rank_step_time_seconds) / "
                        "quantile(0.5, eagleeye_rank_step_time_seconds) - 1",
                        "slowdown",
                    )
                ],
            ),
            ("Data wait per rank", "s", [("eagleeye_rank_data_wait_seconds", "rank {{rank}}")]),
        ],
    ),
    (
        "GPUs",
        [
            ("Temperature", "celsius", [("DCGM_FI_DEV_GPU_TEMP", _GPU_LEGEND)]),
            ("Utilisation", "percent", [("DCGM_FI_DEV_GPU_UTIL", _GPU_LEGEND)]),
            (
                "XID events (5m)",
                "none",
                [
                    (
                        "increase(eagleeye_gpu_xid_events_total[5m])",
                        "{{Hostname}}/{{gpu}} xid {{xid}}",
                    )
                ],
            ),
        ],
    ),
    (
        "Eagle Eye",
        [
            (
                "Findings by kind (rate)",
                "short",
                [("sum by (kind) (rate(eagleeye_findings_total[5m]))", "{{kind}}")],
            ),
            (
                "Actions by kind and outcome (1h)",
                "short",
                [
                    (
                        "sum by (kind, status) (increase(eagleeye_actions_total[1h]))",
                        "{{kind}} {{status}}",
                    )
                ],
            ),
            ("Checkpoints by state", "stat:short", [("eagleeye_checkpoints", "{{state}}")]),
            ("Pending approvals", "stat:short", [("eagleeye_pending_approvals", "pending")]),
        ],
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


def build_dashboard(datasource_uid: str = "prometheus") -> dict[str, Any]:
    """The training dashboard as Grafana JSON (a plain dict)."""
    _require()
    ds = DataSourceRef(type_val="prometheus", uid=datasource_uid)
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
    return result


def dashboard_json(datasource_uid: str = "prometheus") -> str:
    return json.dumps(build_dashboard(datasource_uid), indent=2, sort_keys=True) + "\n"


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
