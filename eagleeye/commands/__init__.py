"""Subcommands of the CLI. Each module exposes ``add_parser(subparsers)``, which registers
its parser and sets ``func`` to a callable taking the parsed arguments."""

from __future__ import annotations

from eagleeye.commands import demo, detect, eval, run

COMMANDS = (run, demo, detect, eval)

__all__ = ["COMMANDS"]
