"""Argument types shared by the subcommands: each turns bad input into one clear line."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path


def whole(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None


def positive(text: str) -> int:
    value = whole(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative(text: str) -> int:
    value = whole(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds >= 0, got {text}")
    return value


def port(text: str) -> int:
    value = whole(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0 to 65535 (0: any free one), got {value}")
    return value


def output_file(text: str) -> Path:
    """A file to write: its folder must exist and be writable (checked before any work)."""
    path = Path(text)
    folder = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder; give a file name")
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(
            f"cannot write {text}: folder {folder} does not exist; create it or choose another"
        )
    if not os.access(folder, os.W_OK):
        raise argparse.ArgumentTypeError(f"cannot write {text}: folder {folder} is not writable")
    return path


def address_port(text: str) -> tuple[str, int]:
    """``ADDR:PORT`` (``[v6]:PORT`` for IPv6; ``:PORT`` is loopback) as (address, port).

    >>> address_port("0.0.0.0:9200"), address_port(":0"), address_port("[::1]:80")
    (('0.0.0.0', 9200), ('127.0.0.1', 0), ('::1', 80))
    """
    host, sep, port_text = text.rpartition(":")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected ADDR:PORT, got {text!r}")
    return (host.strip("[]") or "127.0.0.1", port(port_text))
