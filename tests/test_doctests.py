"""Runs the examples in the records' and plugins' docstrings."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "collector.types",
    "collector.events",
    "collector.xid",
    "collector.kmsg",
    "collector.exporter",
    "eagleeye.exporter",
    "eagleeye.goodput",
    "eagleeye.rerun",
    "eagleeye.rank_output",
    "eagleeye.agents.places",
    "eagleeye.cli",
    "ft_runtime.faults",
    "collector.nvml",
    "collector.host",
    "collector.aggregate",
    "collector.instrument",
    "collector.hooks",
    "detectors.types",
    "detectors.rules",
    "detectors.stepbatch",
    "detectors.peer",
    "detectors.numerics",
    "detectors.changepoint",
    "detectors.hang",
    "detectors.progress",
    "detectors.gates",
    "detectors.univariate",
    "detectors._season",
    "detectors.eval.nab",
    "ft_runtime.types",
    "ft_runtime.layout",
    "ft_runtime.testing",
    "ft_runtime.membership",
    "ft_runtime.replica.protocol",
    "ft_runtime.replica.state",
    "ft_runtime.replica.config",
    "ft_runtime.ckpt._shm",
    "ft_runtime.ckpt.config",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0, f"{name} has no examples to run"
    assert result.failed == 0
