"""Zero-code: a script's own checkpoints, seen through ``torch.save``.

A ``torch.save`` to a file (a path, not a buffer) is a checkpoint of the script: while it
writes, the rank is in a declared ``checkpoint`` pause (a long save is no hang), and once
written it is reported like the hook's saves (``event.checkpoint``, tier disk, with its
path, size and seconds). Eagle Eye then knows the newest checkpoint to resume from on a
restart (``EAGLEEYE_RESUME_FROM``). Saves into buffers (the hook's own checkpointer
serialises into memory first) are not reported twice.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from typing import Any

from collector.hooks import TrainingHook


def watch_saves(hook: TrainingHook) -> Callable[[], None]:
    """Wraps ``torch.save``; returns the undo."""
    import torch

    original = torch.save

    @functools.wraps(original)
    def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(f, (str, os.PathLike)):
            return original(obj, f, *args, **kwargs)
        started = time.perf_counter()
        with hook.pause("checkpoint"):
            result = original(obj, f, *args, **kwargs)
        _report(hook, os.fspath(f), time.perf_counter() - started)
        return result

    torch.save = save

    def undo() -> None:
        torch.save = original

    return undo


def _report(hook: TrainingHook, path: str, seconds: float) -> None:
    try:
        nbytes = os.path.getsize(path)
        step = hook.step
        hook.event(
            "event.checkpoint",
            float(-1 if step is None else step),
            tier="disk",
            path=os.path.abspath(path),
            bytes=str(nbytes),
            seconds=f"{seconds:.6f}",
            source="torch.save",
        )
    except OSError:
        pass  # the file went away at once: nothing to resume from
