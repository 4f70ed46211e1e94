"""SPARe: stacked redundancy that masks group failures while keeping the exact gradient."""

from __future__ import annotations

from ft_runtime.spare.controller import Assignment, ReCtlr, min_stack
from ft_runtime.spare.errors import LayoutError, WipeOutError
from ft_runtime.spare.layout import StackedLayout, sidon_offsets

__all__ = [
    "Assignment",
    "LayoutError",
    "ReCtlr",
    "StackedLayout",
    "WipeOutError",
    "min_stack",
    "sidon_offsets",
]
