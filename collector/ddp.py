"""DistributedDataParallel's gradient all-reduce, made visible to the collective wrappers.

DDP's reducer issues its bucket all-reduces from C++, where the ``torch.distributed``
wrappers of ``collector.instrument`` cannot see them. PyTorch ships a reference comm hook,
``default_hooks.allreduce_hook`` (divide by the group size, then ``dist.all_reduce``; its
documentation promises the same result as no hook), and a comm hook runs in Python: with
it registered, every bucket's all-reduce goes through the wrappers, with its bytes, its
enter (the bucket is ready) and its exit (the all-reduce completed).

``watch_ddp()`` registers that hook on each DDP model at its first forward, unless the
script registered a comm hook of its own by then. A script's Python hook that calls
``torch.distributed`` (PowerSGD, the compression hooks) is seen anyway; a built-in C++
hook (``_register_builtin_comm_hook``) is not, and neither is DDP's start-up broadcast of
the model's state.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

_OWN = "_eagleeye_own_comm_hook"
_PENDING = "_eagleeye_first_forward"


def watch_ddp() -> Callable[[], None]:
    """Routes every DDP model built from now on through the reference comm hook; returns
    the undo (models built meanwhile keep their hook)."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    init, register = DDP.__init__, DDP.register_comm_hook
    builtin: Any = DDP._register_builtin_comm_hook

    def first_forward(module: Any, args: Any) -> None:
        handle = module.__dict__.pop(_PENDING, None)
        if handle is not None:
            handle.remove()
        if module.__dict__.get(_OWN):
            return  # the script chose its own comm hook
        try:
            register(module, module.process_group, allreduce_hook)
        except Exception as exc:  # DDP keeps its C++ all-reduce: unseen, never broken
            log.warning("eagleeye: DDP's all-reduce stays untimed: %s", exc)

    @functools.wraps(init)
    def watched_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.__dict__[_PENDING] = self.register_forward_pre_hook(first_forward)

    @functools.wraps(register)
    def own_hook(self: Any, state: object, hook: Callable[..., Any]) -> None:
        self.__dict__[_OWN] = True
        register(self, state, hook)

    @functools.wraps(builtin)
    def own_builtin(self: Any, comm_hook_type: Any) -> None:
        self.__dict__[_OWN] = True
        builtin(self, comm_hook_type)

    DDP.__init__ = watched_init  # type: ignore[method-assign]
    DDP.register_comm_hook = own_hook  # type: ignore[method-assign]
    DDP._register_builtin_comm_hook = own_builtin  # type: ignore[method-assign]

    def undo() -> None:
        DDP.__init__ = init  # type: ignore[method-assign]
        DDP.register_comm_hook = register  # type: ignore[method-assign]
        DDP._register_builtin_comm_hook = builtin  # type: ignore[method-assign]

    return undo
