"""Subcommands of the CLI. Each module exposes ``add_parser(subparsers)``, which registers
its parser and sets ``func`` to a callable taking the parsed arguments."""

from __future__ import annotations

from eagleeye.commands import (
    agent,
    alerts,
    collect,
    controller,
    dashboard,
    demo,
    detect,
    eval,
    grafana,
    plan,
    run,
)

COMMANDS = (run, demo, controller, agent, collect, detect, eval, plan, dashboard, alerts, grafana)

__all__ = ["COMMANDS"]
