"""The flags `eagleeye run` and `eagleeye controller` share: remediation (``--remediate``,
``--policy``), the exporter (``--metrics-*``), Alertmanager's webhook (``--webhook``,
``--alerts-*``) and TLS for both HTTP endpoints."""

from __future__ import annotations

import argparse
from typing import Any

from eagleeye.commands._args import address_port, port


def add_remediate(g: Any) -> None:
    g.add_argument(
        "--remediate",
        action="store_true",
        help="execute remediation actions; without it they are recorded as dry-run",
    )


def add_policy(g: Any, default: str) -> None:
    g.add_argument(
        "--policy",
        default=None,
        metavar="FILE",
        help=f"remediation policy (TOML; see remediation/policies/); default: {default}",
    )


def add_metrics(g: Any) -> None:
    g.add_argument(
        "--metrics-port",
        type=port,
        default=None,
        metavar="PORT",
        help="serve Prometheus metrics of the run on --metrics-address:PORT while it runs "
        "(0 picks a free port); a busy port stops the run before it starts",
    )
    g.add_argument(
        "--metrics-address",
        default="127.0.0.1",
        metavar="ADDR",
        help="address the metrics are served on (default: 127.0.0.1, this machine only; "
        "0.0.0.0 for a Prometheus elsewhere)",
    )
    g.add_argument(
        "--metrics-linger",
        type=float,
        default=0.0,
        metavar="S",
        help="keep serving the run's final metrics for S seconds after it ends, so that "
        "Prometheus scrapes the last state (default: 0)",
    )


def add_webhook(g: Any, where: str) -> None:
    """``where``: what an alert naming a host lands on (the help's last words)."""
    g.add_argument(
        "--alerts-port",
        type=int,
        default=None,
        metavar="PORT",
        help="serve Alertmanager's webhook (POST /alerts) for this run on "
        "--alerts-address:PORT: routed alerts become the run's findings, remediated by its "
        "policy (0 picks a free port)",
    )
    g.add_argument(
        "--alerts-address",
        default="127.0.0.1",
        metavar="ADDR",
        help="address of the alert webhook (default: 127.0.0.1)",
    )
    g.add_argument(
        "--webhook",
        type=address_port,
        default=None,
        metavar="ADDR:PORT",
        help="serve Alertmanager's webhook on ADDR:PORT (the same as --alerts-address ADDR "
        f"--alerts-port PORT); {where}",
    )
    g.add_argument(
        "--alerts-token-file",
        "--webhook-token-file",
        default=None,
        metavar="FILE",
        help="file with the bearer token Alertmanager sends (the config's credentials_file)",
    )


def add_tls(g: Any) -> None:
    g.add_argument(
        "--tls-cert",
        default=None,
        metavar="FILE",
        help="serve the metrics and the webhook over HTTPS with this certificate (PEM); "
        "with --tls-key",
    )
    g.add_argument(
        "--tls-key", default=None, metavar="FILE", help="the private key of --tls-cert (PEM)"
    )


def webhook_of(args: argparse.Namespace) -> tuple[str, int | None]:
    """The webhook's address and port: ``--webhook ADDR:PORT``, else the ``--alerts-*``
    flags."""
    given = getattr(args, "webhook", None)
    if given is not None:
        return given[0], given[1]
    return getattr(args, "alerts_address", "127.0.0.1"), getattr(args, "alerts_port", None)
