"""Runs the examples in remediation's and the exporter's docstrings."""

from __future__ import annotations

import doctest
import importlib

import pytest


@pytest.mark.parametrize("name", ["remediation.policy", "remediation.hooks", "eagleeye.exporter"])
def test_docstring_examples(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0, f"{name} has no examples to run"
    assert result.failed == 0
