"""`eagleeye alerts`: write the Prometheus alerting rules and the Alertmanager config, and
run the rules' shipped unit tests."""

from __future__ import annotations

import argparse
import sys
from typing import Any

TOKEN_ENV = "EAGLEEYE_TOKEN"
"""Environment variable holding the webhook's alert token (library use; the CLI writes
token files)."""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "alerts",
        help="generate Prometheus alerting rules and an Alertmanager config; test the rules",
        description=(
            "`rules` writes alerting rules (states: a stalled training fires while it lasts; "
            "GPU faults on dcgm-exporter's names; XIDs through changes()); `alertmanager` "
            'writes a config routing remediate="true" alerts to Eagle Eye\'s webhook, its '
            "token in a file; `test` runs the shipped promtool unit tests of the rules. "
            "Check the files with `promtool check rules` and `amtool check-config`."
        ),
    )
    actions = p.add_subparsers(dest="alerts_action", required=True)
    rules = actions.add_parser("rules", help="write the alerting rules")
    rules.add_argument("-o", "--output", required=True, help="rule file to write")
    rules.add_argument(
        "--stall", default="2m", help="no step for this long is a stalled training (2m)"
    )
    rules.add_argument(
        "--change", default="2m", help="range of changes() and increase() on events (2m)"
    )
    rules.add_argument(
        "--sustain", default="5m", help="how long a slow rank or a hot GPU must last (5m)"
    )
    rules.add_argument(
        "--runbooks",
        default="docs/runbooks",
        help="base URL of the runbook pages (runbook_url = BASE/<alert>.md)",
    )
    am = actions.add_parser("alertmanager", help="write the Alertmanager config")
    am.add_argument("-o", "--output", required=True, help="config file to write")
    am.add_argument("--webhook-url", required=True, help="Eagle Eye's webhook, .../alerts")
    am.add_argument(
        "--token-file",
        required=True,
        help="file holding the webhook's alert token; the config names it (credentials_file)",
    )
    am.add_argument(
        "--new-token",
        action="store_true",
        help="write a new random token into --token-file (mode 0600; it must not exist)",
    )
    am.add_argument("--notify-url", default=None, help="a webhook for people (optional)")
    test = actions.add_parser("test", help="run the shipped promtool unit tests of the rules")
    test.add_argument("--promtool", default=None, help="promtool binary (default: on PATH)")
    p.set_defaults(func=_alerts)


def _alerts(args: argparse.Namespace) -> int:
    from eagleeye.alerting import Windows, write_alertmanager_config, write_rules
    from eagleeye.alerting.alertmanager import read_token_file, write_token_file

    if args.alerts_action == "test":
        from eagleeye.alerting.ruletest import run_rule_tests

        result = run_rule_tests(args.promtool)
        sys.stdout.write(result.stdout)
        sys.stderr.write(result.stderr)
        return result.returncode
    if args.alerts_action == "rules":
        windows = Windows(stall=args.stall, change=args.change, sustain=args.sustain)
        path = write_rules(args.output, windows, args.runbooks)
    else:
        if args.new_token:
            print(f"wrote a new token to {write_token_file(args.token_file)}")
        read_token_file(args.token_file)  # missing or empty: one clear error now
        path = write_alertmanager_config(
            args.output,
            webhook_url=args.webhook_url,
            credentials_file=args.token_file,
            notify_url=args.notify_url,
        )
    print(f"wrote {path}")
    return 0
