"""`eagleeye alerts`: write the Prometheus alerting rules and the Alertmanager config."""

from __future__ import annotations

import argparse
import os
from typing import Any

TOKEN_ENV = "EAGLEEYE_TOKEN"
"""Environment variable holding the webhook's bearer token."""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "alerts",
        help="generate Prometheus alerting rules and an Alertmanager config",
        description=(
            "`rules` writes alerting rules for every finding kind and the GPU faults (XID "
            'through changes()); `alertmanager` writes a config routing remediate="true" '
            "alerts to Eagle Eye's token-authenticated webhook. Check them with "
            "`promtool check rules` and `amtool check-config`."
        ),
    )
    actions = p.add_subparsers(dest="alerts_action", required=True)
    rules = actions.add_parser("rules", help="write the alerting rules")
    rules.add_argument("-o", "--output", required=True, help="rule file to write")
    rules.add_argument("--window", default="1m", help="PromQL range for changes() (default: 1m)")
    am = actions.add_parser("alertmanager", help="write the Alertmanager config")
    am.add_argument("-o", "--output", required=True, help="config file to write (mode 0600)")
    am.add_argument("--webhook-url", required=True, help="Eagle Eye's webhook, .../alerts")
    am.add_argument("--token", default=None, help=f"webhook token (default: ${TOKEN_ENV})")
    am.add_argument("--notify-url", default=None, help="a webhook for people (optional)")
    p.set_defaults(func=_alerts)


def _alerts(args: argparse.Namespace) -> int:
    from eagleeye.alerting import write_alertmanager_config, write_rules

    if args.alerts_action == "rules":
        path = write_rules(args.output, window=args.window)
    else:
        path = write_alertmanager_config(
            args.output,
            webhook_url=args.webhook_url,
            token=args.token or os.environ.get(TOKEN_ENV, ""),
            notify_url=args.notify_url,
        )
    print(f"wrote {path}")
    return 0
