"""Steps, step times and the loss of a training loop that reports nothing itself.

``AutoSteps(hook).install()`` registers PyTorch's global optimizer step hook
(``torch.optim.optimizer.register_optimizer_step_post_hook``): each step of the first
optimizer that steps closes one training step and opens the next. The first step opens at
the first ``backward()``, so start-up is not counted as a step. Every later step's time is
the time between two optimizer steps, so it includes data loading, forward, backward and
the collectives, as a loop's own step timer would.

The loss is the scalar that ``backward()`` is called on (summed over the backward calls of
one step: with gradient accumulation, a loop that divides each micro-batch's loss by their
number reports the step's mean). A loss scaled by ``torch.amp.GradScaler.scale`` is taken
before scaling. The value is read without a device sync: a CPU loss at the step's end, a
CUDA loss copied asynchronously and read at a later step, once its copy has completed, so
a GPU run pays no synchronisation for it. A ``backward()`` on a non-scalar gives no loss.
The learning rate of the first parameter group is reported when it is a plain number.

Once the loop reports its own steps through the hook (``step_start``), the hook ignores
these, so a script that also uses the hook is not counted twice.
"""

from __future__ import annotations

import functools
import logging
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from collector.hooks import TrainingHook

log = logging.getLogger(__name__)
_PENDING_MAX = 64  # CUDA losses waiting for their copy; older ones are dropped


class _Lazy:
    """A scalar read without a device sync: at once on CPU, after its copy on CUDA."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self._event: Any = None
        if tensor.is_cuda:
            self._host = tensor.to("cpu", non_blocking=True)
            self._event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            self._event.record()
        else:
            self._host = tensor

    def ready(self) -> bool:
        return self._event is None or bool(self._event.query())

    def value(self) -> float:
        return float(self._host)


class AutoSteps:
    """Finds the step boundaries and the loss of an unmodified loop (see the module).

    Args:
        hook: where the steps go; its loop-reported steps take precedence.
    """

    def __init__(self, hook: TrainingHook) -> None:
        self.hook = hook
        self.step = 0
        self._open = False
        self._primary: weakref.ref[torch.optim.Optimizer] | None = None
        self._loss: torch.Tensor | None = None
        self._pending: deque[tuple[int, _Lazy]] = deque()
        self._scaled: dict[int, torch.Tensor] = {}
        self._errors: set[str] = set()

    def install(self) -> Callable[[], None]:
        """Registers the optimizer hook and wraps ``Tensor.backward`` and
        ``GradScaler.scale``; returns the undo."""
        from torch.optim.optimizer import register_optimizer_step_post_hook

        handle = register_optimizer_step_post_hook(self._after_step)
        backward = torch.Tensor.backward
        torch.Tensor.backward = self._wrap_backward(backward)  # type: ignore[method-assign]
        scaler: Any = getattr(torch.amp, "GradScaler", None)
        scale = getattr(scaler, "scale", None)
        if scale is not None:
            scaler.scale = self._wrap_scale(scale)

        def undo() -> None:
            handle.remove()
            torch.Tensor.backward = backward  # type: ignore[method-assign]
            if scale is not None:
                scaler.scale = scale

        return undo

    # ---- hooks (they never raise into the loop) -------------------------------------------
    def _wrap_backward(self, backward: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(backward)
        def watched(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            try:
                self._saw_backward(tensor)
            except Exception as exc:
                self._note(exc)
            return backward(tensor, *args, **kwargs)

        return watched

    def _wrap_scale(self, scale: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(scale)
        def watched(scaler: Any, outputs: Any) -> Any:
            scaled = scale(scaler, outputs)
            if isinstance(outputs, torch.Tensor) and isinstance(scaled, torch.Tensor):
                if len(self._scaled) > 8:  # scaled tensors never backward'd: forget them
                    self._scaled.clear()
                self._scaled[id(scaled)] = outputs.detach()
            return scaled

        return watched

    def _saw_backward(self, tensor: torch.Tensor) -> None:
        if not self._open:
            self._open = True
            self.hook.auto_step_start(self.step)
        unscaled = self._scaled.pop(id(tensor), None)
        loss = unscaled if unscaled is not None else tensor.detach()
        if loss.numel() != 1 or not loss.is_floating_point():
            return
        self._loss = loss if self._loss is None else self._loss + loss

    def _after_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        try:
            if not self._is_primary(optimizer):
                return
            metrics: dict[str, float] = {}
            lr = optimizer.param_groups[0].get("lr") if optimizer.param_groups else None
            if isinstance(lr, (int, float)):
                metrics["lr"] = float(lr)
            if self._loss is not None:
                self._pending.append((self.step, _Lazy(self._loss.reshape(()))))
                self._loss = None
            self._read_losses(metrics)
            if self._open:
                self.hook.auto_step_end(self.step, **metrics)
            self.step += 1
            self._open = True
            self.hook.auto_step_start(self.step)
        except Exception as exc:
            self._note(exc)

    def _is_primary(self, optimizer: torch.optim.Optimizer) -> bool:
        """The first optimizer that steps marks the steps (a second one, as in a GAN, is
        part of the same step); when it is gone, the next one to step takes over."""
        primary = self._primary() if self._primary is not None else None
        if primary is None:
            self._primary = weakref.ref(optimizer)
            return True
        return primary is optimizer

    def _read_losses(self, metrics: dict[str, float]) -> None:
        """Losses whose value is on the host: this step's goes with it, older ones are
        sent for their own step."""
        while len(self._pending) > _PENDING_MAX:
            self._pending.popleft()
        while self._pending and self._pending[0][1].ready():
            step, lazy = self._pending.popleft()
            if step == self.step:
                metrics["loss"] = lazy.value()
            else:
                self.hook.record_at(step, "loss", lazy.value())

    def _note(self, exc: Exception) -> None:
        key = f"{type(exc).__name__}: {exc}"
        if key not in self._errors:
            self._errors.add(key)
            log.warning(
                "eagleeye step hook error (telemetry dropped, training unaffected): %s", key
            )
