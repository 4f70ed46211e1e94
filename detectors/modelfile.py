"""Fitted learned scorers in one file of plain arrays (NumPy ``.npz``), never pickled.

``save_models(path, scorers)`` writes each scorer's ``to_arrays`` under its name;
``load_models(path)`` reads them back with ``allow_pickle=False``, so a model file can
hold numbers only: loading one runs no code from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from detectors.errors import DetectorError
from detectors.learned import LearnedScorer


def save_models(path: Path, scorers: Sequence[LearnedScorer]) -> None:
    """Writes the fitted scorers to ``path`` (.npz)."""
    arrays: dict[str, np.ndarray] = {}
    for scorer in scorers:
        arrays |= {f"{scorer.name}::{k}": v for k, v in scorer.to_arrays().items()}
    with path.open("wb") as out:
        np.savez(out, **arrays)  # type: ignore[arg-type]  # numpy's stub types allow_pickle


def load_models(path: Path, **overrides: Any) -> list[LearnedScorer]:
    """The fitted scorers of a model file, frozen unless ``overrides`` say otherwise.

    Raises:
        DetectorError: the file is missing, not an .npz of arrays, or not a model file.
    """
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except (OSError, ValueError) as exc:
        raise DetectorError(f"cannot read model file {path}: {exc}") from None
    names = sorted({k.split("::", 1)[0] for k in arrays if "::" in k})
    if not names:
        raise DetectorError(f"{path} holds no fitted scorer (written by --save-model?)")
    try:
        return [
            LearnedScorer.from_arrays(
                {k.split("::", 1)[1]: v for k, v in arrays.items() if k.startswith(f"{n}::")},
                **overrides,
            )
            for n in names
        ]
    except (KeyError, ValueError, TypeError) as exc:
        raise DetectorError(f"{path} is not a valid model file: {exc}") from None
