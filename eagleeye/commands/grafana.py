"""`eagleeye grafana`: write the dashboard JSON, or push it to a Grafana server."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

TOKEN_ENV = "EAGLEEYE_GRAFANA_TOKEN"
"""Environment variable holding the Grafana API token, so it stays out of shell history."""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "grafana",
        help="Grafana dashboards as code: export the JSON or push it (needs the grafana extra)",
        description=(
            "Builds Eagle Eye's training dashboard with grafana-foundation-sdk. `export` "
            "writes its JSON; `push` uploads it with grafana-client, only when a URL and a "
            f"token (--token or ${TOKEN_ENV}) are given."
        ),
    )
    actions = p.add_subparsers(dest="grafana_action", required=True)
    export = actions.add_parser("export", help="write the dashboard JSON")
    export.add_argument("-o", "--output", default="-", help="file to write (default: stdout)")
    push = actions.add_parser("push", help="create or overwrite the dashboard on Grafana")
    push.add_argument("--url", required=True, help="Grafana base URL, e.g. https://grafana:3000")
    push.add_argument("--token", default=None, help=f"API token (default: ${TOKEN_ENV})")
    push.add_argument("--folder-uid", default=None, help="folder to put it in")
    for q in (export, push):
        q.add_argument(
            "--datasource",
            default="prometheus",
            help="default of the dashboard's $datasource variable, a Prometheus data source "
            "uid; panels use the variable (default: prometheus)",
        )
    p.set_defaults(func=_grafana)


def _grafana(args: argparse.Namespace) -> int:
    from eagleeye import grafana

    if args.grafana_action == "export":
        text = grafana.dashboard_json(args.datasource)
        if args.output == "-":
            sys.stdout.write(text)
        else:
            Path(args.output).write_text(text, encoding="utf-8")
        return 0
    token = args.token or os.environ.get(TOKEN_ENV, "")
    board = grafana.build_dashboard(args.datasource)
    result = grafana.push(args.url, token, board, args.folder_uid)
    print(f"pushed dashboard {grafana.DASHBOARD_UID}: {result}")
    return 0
