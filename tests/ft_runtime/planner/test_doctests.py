from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "ft_runtime.spare.layout",
    "ft_runtime.spare.controller",
    "ft_runtime.planner.intervals",
    "ft_runtime.planner.spare_math",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0
    assert result.failed == 0
