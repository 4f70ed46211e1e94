"""The runnable examples in the detectors' docstrings."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "detectors.stepbatch",
    "detectors.peer",
    "detectors.numerics",
    "detectors.changepoint",
    "detectors.hang",
    "detectors.rules",
    "detectors.gates",
    "detectors.univariate",
    "detectors.eval.nab",
    "detectors.types",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0
    assert result.failed == 0
