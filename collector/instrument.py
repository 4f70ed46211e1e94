"""Times the torch.distributed collectives a training step issues, without code changes.

``instrument_collectives(hook)`` wraps the collective functions of ``torch.distributed``
so that every call records, through the hook, its enter and exit time, op, bytes, process
group and a per-group sequence number (as NCCL's flight recorder numbers them). An
asynchronous call (``async_op=True``) is timed until its ``wait()`` returns or its future
completes. The wrappers add a few microseconds per call and never change what the
collective does or raises. Inside a collective the loop times itself
(``hook.collective(...)``) they stand aside, so nothing is recorded twice.

What they see: calls through the ``torch.distributed`` namespace (``dist.all_reduce``, the
DDP comm hooks written in Python, Lightning's and Hugging Face's metric syncs). What they
do not see: collectives issued from C++ (DDP's built-in reducer, unless
``collector.ddp`` routes it through a Python comm hook) and functional collectives. With
NCCL a collective returns once it is queued on the GPU, so a wait shows only where the
host waits for it.

>>> import torch.distributed as dist
>>> from collector.hooks import TrainingHook
>>> hook = TrainingHook(lambda labels, rows: True, {})
>>> with instrument_collectives(hook):
...     dist.all_reduce is not _ORIGINALS.get("all_reduce")
True
>>> hook.close()
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

from collector.hooks import TrainingHook

COLLECTIVES = (
    "all_reduce",
    "broadcast",
    "reduce",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "gather",
    "scatter",
)
_ORIGINALS: dict[str, Callable[..., Any]] = {}


def _nbytes(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """Bytes of the first tensor (or list of tensors) the call was given."""
    first = args[0] if args else next(iter(kwargs.values()), None)
    if isinstance(first, torch.Tensor):
        return first.numel() * first.element_size()
    if isinstance(first, (list, tuple)):
        return sum(t.numel() * t.element_size() for t in first if isinstance(t, torch.Tensor))
    return 0


def _group_name(kwargs: dict[str, Any]) -> str:
    group = kwargs.get("group")
    if group is None:
        return "world"
    return str(getattr(group, "group_name", None) or id(group))


class _TimedWork:
    """Wraps an async collective's Work: its exit is recorded once, when ``wait()``
    returns or when its future completes, whichever comes first."""

    def __init__(self, work: Any, done: Callable[[], None]) -> None:
        self._work = work
        self._done = done
        self._once = threading.Lock()
        self._closed = False

    def _close(self, *_: Any) -> None:
        with self._once:
            if self._closed:
                return
            self._closed = True
        self._done()

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return self._work.wait(*args, **kwargs)
        finally:
            self._close()

    def get_future(self) -> Any:
        future = self._work.get_future()
        future.add_done_callback(self._close)
        return future

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


def _wrap(name: str, original: Callable[..., Any], hook: TrainingHook) -> Callable[..., Any]:
    @functools.wraps(original)
    def timed(*args: Any, **kwargs: Any) -> Any:
        if hook.timing_explicitly:  # the loop times this one itself
            return original(*args, **kwargs)
        token = hook.collective_enter(name, _group_name(kwargs))
        try:
            result = original(*args, **kwargs)
        except BaseException:
            hook.collective_exit(token, _nbytes(args, kwargs))
            raise
        nbytes = _nbytes(args, kwargs)
        if kwargs.get("async_op") and result is not None:
            return _TimedWork(result, lambda: hook.collective_exit(token, nbytes))
        hook.collective_exit(token, nbytes)
        return result

    return timed


def patch_collectives(hook: TrainingHook) -> Callable[[], None]:
    """Wraps every torch.distributed collective not wrapped already; returns the undo.

    A second call while the first is in force wraps nothing (its undo does nothing), so
    the zero-code instrumentation and a session's ``instrument_collectives()`` never time
    one call twice.
    """
    patched = []
    for name in COLLECTIVES:
        original = getattr(dist, name, None)
        if original is None or name in _ORIGINALS:
            continue
        _ORIGINALS[name] = original
        setattr(dist, name, _wrap(name, original, hook))
        patched.append(name)

    def undo() -> None:
        for name in patched:
            setattr(dist, name, _ORIGINALS.pop(name))

    return undo


@contextmanager
def instrument_collectives(hook: TrainingHook) -> Iterator[None]:
    """Times every torch.distributed collective while the context is open."""
    undo = patch_collectives(hook)
    try:
        yield
    finally:
        undo()
