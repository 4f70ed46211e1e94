"""What both framework callbacks share: the hook they feed, token counting, error policy."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any, Protocol

log = logging.getLogger(__name__)


class StepHook(Protocol):
    """Where a callback reports: a ``collector.TrainingHook`` or the session that
    ``eagleeye.init()`` returns (both have these methods). A pause (evaluation, a
    checkpoint save) tells the hang detector that no step completes while it lasts."""

    def step_start(self, step: int) -> None: ...

    def step_end(self, step: int | None = None, **metrics: float) -> None: ...

    def begin_pause(self, name: str) -> None: ...

    def end_pause(self, name: str) -> None: ...


class MissingFrameworkError(ImportError):
    """The callback's framework is not installed."""


def import_framework(modules: Sequence[str], extra: str) -> ModuleType:
    """The first of ``modules`` that imports; an error naming the extra to install otherwise."""
    for name in modules:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise MissingFrameworkError(
        f"{' or '.join(modules)} is not installed; install it with "
        f"`pip install 'eagleeye[{extra}]'` to use this callback"
    )


def count_tokens(batch: Any) -> int | None:
    """Tokens in a batch of token ids, or None when the batch does not show them.

    A mapping counts the ones of its ``attention_mask`` when it has one, else the
    elements of ``input_ids``; a tuple or list counts its first element; an integer
    tensor counts its elements. Float tensors (features, not token ids) give None.
    """
    if isinstance(batch, Mapping):
        mask = batch.get("attention_mask")
        if mask is not None and _is_int_tensor(mask):
            return int(mask.sum())
        return count_tokens(batch.get("input_ids"))
    if isinstance(batch, list | tuple):
        return count_tokens(batch[0]) if batch else None
    if _is_int_tensor(batch):
        return int(batch.numel())
    return None


def _is_int_tensor(value: Any) -> bool:
    dtype = getattr(value, "dtype", None)
    if dtype is None or not hasattr(value, "numel"):
        return False
    return not (getattr(dtype, "is_floating_point", True) or getattr(dtype, "is_complex", True))


def scalar(value: Any) -> float | None:
    """A float from a number or a one-element tensor; None when it is neither."""
    try:
        return float(value.item() if hasattr(value, "item") else value)
    except (TypeError, ValueError, RuntimeError):
        return None


class ErrorOnce:
    """Logs each distinct error once: a callback never raises into the training loop."""

    def __init__(self, framework: str) -> None:
        self.framework = framework
        self._seen: set[str] = set()

    def __call__(self, exc: Exception) -> None:
        key = f"{type(exc).__name__}: {exc}"
        if key not in self._seen:
            self._seen.add(key)
            log.warning(
                "eagleeye %s callback error (telemetry dropped, training unaffected): %s",
                self.framework,
                key,
            )
