"""What a person reads: times as UTC dates, durations in seconds, sizes in bytes units.

The store keeps times as epoch seconds (floats). Vega-Lite reads a number on a temporal axis
as epoch *milliseconds*, so every time goes through ``to_datetime`` before it reaches a chart
or a table.
"""

from __future__ import annotations

import math

import pandas as pd

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def to_datetime(seconds: pd.Series) -> pd.Series:
    """Epoch seconds as timezone-aware UTC datetimes (missing stays missing)."""
    return pd.to_datetime(pd.to_numeric(seconds, errors="coerce"), unit="s", utc=True)


def human_bytes(value: float | None) -> str:
    """``1536`` → ``1.5 KiB``; missing → empty."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    size = float(value)
    for unit in _UNITS:
        if abs(size) < 1024 or unit == _UNITS[-1]:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def human_seconds(value: float | None) -> str:
    """A duration: ``0.0123`` → ``12.3 ms``, ``75`` → ``1 min 15 s``; missing → empty."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    seconds = float(value)
    if abs(seconds) < 1:
        return f"{seconds * 1000:.1f} ms"
    if abs(seconds) < 60:
        return f"{seconds:.2f} s"
    if abs(seconds) < 3600:
        return f"{int(seconds // 60)} min {seconds % 60:.0f} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"


def readable(frame: pd.DataFrame, times: tuple[str, ...] = ("time",)) -> pd.DataFrame:
    """A copy for a table: ``times`` columns as UTC dates to the millisecond, ``bytes`` as
    sizes, ``seconds`` as durations."""
    shown = frame.copy()
    for column in times:
        if column in shown:
            stamps = to_datetime(shown[column]).dt.strftime("%Y-%m-%d %H:%M:%S.%f")
            shown[column] = stamps.str[:-3]
    if "bytes" in shown:
        shown["bytes"] = shown["bytes"].map(human_bytes)
    if "seconds" in shown:
        shown["seconds"] = shown["seconds"].map(human_seconds)
    return shown


def percent(value: float) -> str:
    return "-" if value != value else f"{value:.1%}"


__all__ = ["human_bytes", "human_seconds", "percent", "readable", "to_datetime"]
