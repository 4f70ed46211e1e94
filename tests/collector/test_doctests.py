"""The examples in the collector's docstrings run and hold."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "collector.events",
    "collector.xid",
    "collector.kmsg",
    "collector.exporter",
    "collector.nvml",
    "collector.host",
    "collector.types",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0
    assert result.failed == 0
