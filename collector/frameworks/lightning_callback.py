"""A PyTorch Lightning callback that reports each optimizer step to the in-loop hook.

Lightning is imported only when :func:`lightning_callback` is called (``lightning`` or the
older ``pytorch_lightning``), so Eagle Eye does not depend on it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

import torch

from collector.frameworks.common import ErrorOnce, StepHook, count_tokens, import_framework, scalar

TokenCounter = Callable[[Any], "int | None"]


def lightning_callback(
    hook: StepHook, *, tokens_of: TokenCounter = count_tokens, grad_norm: bool = True
) -> Any:
    """A ``Callback`` for ``Trainer(callbacks=[...])`` that feeds ``hook``.

    One hook step per optimizer step (with gradient accumulation, it spans the
    micro-batches), numbered ``trainer.global_step`` after the step (1 for the first).
    It reports ``loss`` (the sum of the micro-batches' losses as Lightning returns them,
    already divided by ``accumulate_grad_batches``: the step's mean loss), ``lr`` (the
    first parameter group's, as the optimizer steps), ``grad_norm`` (the 2-norm of all
    gradients just before the optimizer step, before clipping) and ``tokens`` (summed
    over the micro-batches, as ``tokens_of`` counts them; nothing when it returns None).
    It declares the pauses between steps: ``validation`` for each validation pass and
    ``checkpoint`` from a checkpoint's save to the next batch, so neither is taken for a
    hang.

    Args:
        hook: a ``collector.TrainingHook`` or the session ``eagleeye.init()`` returns.
        tokens_of: counts the tokens of one batch; the default reads token-id tensors.
        grad_norm: measure the gradient norm (one pass over the gradients per step).

    Raises:
        MissingFrameworkError: neither ``lightning`` nor ``pytorch_lightning`` imports.
    """
    pl = import_framework(("lightning.pytorch", "pytorch_lightning"), "lightning")
    return _callback_class(pl.Callback)(hook, tokens_of, grad_norm)


@functools.cache
def _callback_class(base: type) -> type:
    return type("EagleEyeLightningCallback", (_LightningReporter, base), {})


class _LightningReporter:
    """The callback's behaviour; mixed in ahead of Lightning's ``Callback``."""

    def __init__(self, hook: StepHook, tokens_of: TokenCounter, grad_norm: bool) -> None:
        self._hook = hook
        self._tokens_of = tokens_of
        self._want_norm = grad_norm
        self._error = ErrorOnce("Lightning")
        self._opened_at: int | None = None  # trainer.global_step when the step opened
        self._loss: float | None = None
        self._tokens: int | None = None
        self._metrics: dict[str, float] = {}

    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        try:
            self._hook.end_pause("checkpoint")
            if self._opened_at is None:
                self._opened_at = int(trainer.global_step)
                self._loss, self._tokens, self._metrics = None, None, {}
                self._hook.step_start(self._opened_at + 1)
            tokens = self._tokens_of(batch)
            if tokens is not None:
                self._tokens = (self._tokens or 0) + tokens
        except Exception as exc:
            self._error(exc)

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        try:
            self._metrics["lr"] = float(optimizer.param_groups[0]["lr"])
            if self._want_norm:
                self._metrics["grad_norm"] = _grad_norm(pl_module.parameters())
        except Exception as exc:
            self._error(exc)

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        try:
            loss = scalar(outputs.get("loss") if isinstance(outputs, dict) else outputs)
            if loss is not None:
                self._loss = (self._loss or 0.0) + loss
            if self._opened_at is None or int(trainer.global_step) == self._opened_at:
                return  # accumulating gradients: the step goes on
            metrics = dict(self._metrics)
            if self._loss is not None:
                metrics["loss"] = self._loss
            if self._tokens is not None:
                metrics["tokens"] = float(self._tokens)
            self._opened_at = None
            self._hook.step_end(int(trainer.global_step), **metrics)
        except Exception as exc:
            self._error(exc)

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self._pause("validation")

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self._pause("validation", begin=False)

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: Any) -> None:
        self._pause("checkpoint")  # the file is written after this; the next batch ends it

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._opened_at = None  # a step with no optimizer step is not reported
        self._pause("checkpoint", begin=False)

    def _pause(self, name: str, begin: bool = True) -> None:
        try:
            if begin:
                self._hook.begin_pause(name)
            else:
                self._hook.end_pause(name)
        except Exception as exc:
            self._error(exc)


def _grad_norm(parameters: Iterable[torch.Tensor]) -> float:
    norms = [torch.linalg.vector_norm(p.grad.detach()) for p in parameters if p.grad is not None]
    if not norms:
        return 0.0
    return float(torch.linalg.vector_norm(torch.stack(norms)))
