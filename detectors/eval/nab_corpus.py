"""Reads a NAB corpus: ``data/<group>/<file>.csv`` (timestamp,value) plus ``windows.json``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from detectors.errors import DetectorError
from detectors.eval._csvcheck import numbers, read_csv_checked


@dataclass(frozen=True)
class NabFile:
    """One series of the corpus with its windows as inclusive row-index ranges."""

    name: str
    timestamps: np.ndarray
    values: np.ndarray
    windows: tuple[tuple[int, int], ...]


def read_series(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Reads a ``timestamp,value`` CSV.

    Raises:
        DetectorError: the file is missing, lacks the two columns or has non-numeric values.
    """
    frame = read_csv_checked(path, ("timestamp", "value"))
    values = numbers(frame, "value", str(path))
    return frame["timestamp"].astype(str).to_numpy(), values


def window_rows(timestamps: np.ndarray, start: str, end: str) -> tuple[int, int]:
    """Maps a window given by timestamps onto inclusive row indices."""
    times = pd.to_datetime(pd.Series(timestamps)).to_numpy()
    lo, hi = np.datetime64(pd.Timestamp(start)), np.datetime64(pd.Timestamp(end))
    left = int(np.searchsorted(times, lo, side="left"))
    right = int(np.searchsorted(times, hi, side="right")) - 1
    return left, right


def load_corpus(root: Path) -> Iterator[NabFile]:
    """Yields every file named in ``root/windows.json``, in its order.

    Raises:
        DetectorError: windows.json or a data file is missing.
    """
    labels_path = root / "windows.json"
    if not labels_path.is_file():
        raise DetectorError(
            f"{labels_path} not found: a NAB corpus folder holds windows.json and data/"
        )
    labels = json.loads(labels_path.read_text())
    for name, windows in labels.items():
        timestamps, values = read_series(root / "data" / name)
        rows = tuple(window_rows(timestamps, str(a), str(b)) for a, b in windows)
        yield NabFile(name, timestamps, values, rows)
