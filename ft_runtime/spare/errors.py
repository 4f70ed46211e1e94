"""Errors of SPARe's layout and controller."""

from __future__ import annotations

from ft_runtime.errors import FTRuntimeError


class LayoutError(FTRuntimeError):
    """A stacked layout that breaks SPARe's conditions; the message names the violation."""


class WipeOutError(FTRuntimeError):
    """No assignment covers every shard type: restart from the last checkpoint."""
