"""Reading untrusted CSV traces and series: bounded, and every cell checked before use.

A malformed file is one :class:`DetectorError` naming the file, the row (its line in the
file, the header being line 1) and the column, never a traceback further down. The header
is read first, at most ``MAX_HEADER_BYTES`` of it and at most ``MAX_COLUMNS`` columns, so a
file of a million columns is refused before pandas allocates anything for it.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from detectors.errors import DetectorError

MAX_COLUMNS = 64
MAX_HEADER_BYTES = 64 * 1024
INT64 = 2**63
_NAN_TEXT = {"", "nan", "na", "n/a", "null", "none"}
_INF_TEXT = {"inf", "infinity"}


def read_csv_checked(path: Path, needed: Sequence[str]) -> pd.DataFrame:
    """The CSV at ``path`` as text cells, after checking its header; raises DetectorError."""
    with path.open("rb") as f:
        head = f.readline(MAX_HEADER_BYTES + 1)
    if len(head) > MAX_HEADER_BYTES:
        raise DetectorError(f"{path}: line 1: the header is over {MAX_HEADER_BYTES} bytes")
    try:
        header = head.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DetectorError(f"{path}: line 1: not UTF-8 text (byte {exc.start})") from None
    if header.count(",") + 1 > MAX_COLUMNS:
        raise DetectorError(
            f"{path}: line 1: {header.count(',') + 1} columns, over the {MAX_COLUMNS} allowed"
        )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", pd.errors.ParserWarning)  # a row of extra fields
            frame = pd.read_csv(
                path, dtype=str, keep_default_na=False, encoding="utf-8", index_col=False
            )
    except pd.errors.ParserWarning:
        raise DetectorError(f"cannot read {path}: a row has more fields than the header") from None
    except UnicodeDecodeError as exc:
        raise DetectorError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except (OSError, ValueError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise DetectorError(f"cannot read {path}: {str(exc).splitlines()[0][:200]}") from None
    missing = [c for c in needed if c not in frame.columns]
    if missing:
        raise DetectorError(f"{path} lacks column(s) {missing}; expected {list(needed)}")
    if frame.empty:
        raise DetectorError(f"{path} has a header but no rows")
    return frame


def numbers(frame: pd.DataFrame, column: str, where: str, *, finite: bool = True) -> np.ndarray:
    """A column as floats; non-numbers (and with ``finite`` NaN or infinities) refused."""
    raw = frame[column]
    values = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=float)
    if finite:
        bad = ~np.isfinite(values)
    else:  # NaN and infinities stand for themselves; other text does not
        text = raw.astype(str).str.strip().str.lower()
        blank = raw.isna().to_numpy() | text.isin(_NAN_TEXT).fillna(True).to_numpy(dtype=bool)
        spelled = text.str.lstrip("+-").isin(_INF_TEXT).fillna(False).to_numpy(dtype=bool)
        bad = (np.isnan(values) & ~blank) | (np.isinf(values) & ~spelled)  # inf by overflow
    _refuse(frame, column, bad, "a finite number" if finite else "a number", where)
    return values


def integers(frame: pd.DataFrame, column: str, where: str) -> np.ndarray:
    """A column as int64 counts (0 up to 2**63); anything else refused."""
    raw = frame[column]
    values = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=float)
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(values) | (values < 0) | (values >= INT64) | (values != np.floor(values))
    _refuse(frame, column, bad, "an integer from 0 below 2**63", where)
    return values.astype(np.int64)


def _refuse(frame: pd.DataFrame, column: str, bad: np.ndarray, what: str, where: str) -> None:
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        cell = str(frame[column].iloc[i])
        shown = cell if len(cell) <= 40 else cell[:37] + "..."
        raise DetectorError(f"{where}: line {i + 2}, column {column!r}: {shown!r} is not {what}")
