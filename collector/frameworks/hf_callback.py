"""A Hugging Face ``Trainer`` callback that reports each optimizer step to the in-loop hook.

``transformers`` is imported only when :func:`hf_callback` is called, so Eagle Eye does
not depend on it.
"""

from __future__ import annotations

import functools
from typing import Any

from collector.frameworks.common import ErrorOnce, StepHook, import_framework, scalar

# The Trainer's log keys and the in-loop hook's metric names.
_FROM_LOGS = {"loss": "loss", "grad_norm": "grad_norm", "learning_rate": "lr"}


def hf_callback(hook: StepHook) -> Any:
    """A ``TrainerCallback`` for ``Trainer(callbacks=[...])`` that feeds ``hook``.

    One hook step per optimizer step, numbered ``state.global_step`` after the step (1
    for the first). It reports ``lr`` (the first parameter group's, as the optimizer
    steps), ``tokens`` (the step's share of ``state.num_input_tokens_seen`` per process;
    only with ``TrainingArguments(include_num_input_tokens_seen=...)`` on) and, on the
    steps the Trainer logs (``logging_steps``), ``loss`` and ``grad_norm`` from its log:
    the Trainer's loss is the mean over processes and over the steps since the last log,
    its grad norm the step's norm before clipping. A step the Trainer logs closes when
    the log arrives, right after the step; the others close at the step's end. The
    evaluation and the checkpoint save the Trainer runs after a step are declared pauses
    (``evaluation``, ``checkpoint``), so neither is taken for a hang.

    Args:
        hook: a ``collector.TrainingHook`` or the session ``eagleeye.init()`` returns.

    Raises:
        MissingFrameworkError: ``transformers`` does not import.
    """
    transformers = import_framework(("transformers",), "hf")
    return _callback_class(transformers.TrainerCallback)(hook)


@functools.cache
def _callback_class(base: type) -> type:
    return type("EagleEyeTrainerCallback", (_TrainerReporter, base), {})


class _TrainerReporter:
    """The callback's behaviour; mixed in ahead of ``transformers.TrainerCallback``."""

    def __init__(self, hook: StepHook) -> None:
        self._hook = hook
        self._error = ErrorOnce("Trainer")
        self._tokens_before = 0
        self._metrics: dict[str, float] = {}
        self._ended: int | None = None  # a finished step waiting for the Trainer's log

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        try:
            self._end_pauses()
            self._close()
            self._metrics = {}
            self._tokens_before = int(state.num_input_tokens_seen or 0)
            self._hook.step_start(int(state.global_step) + 1)
        except Exception as exc:
            self._error(exc)

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        try:
            optimizer = kwargs.get("optimizer")
            if optimizer is not None:
                self._metrics["lr"] = float(optimizer.param_groups[0]["lr"])
        except Exception as exc:
            self._error(exc)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        try:
            seen = int(state.num_input_tokens_seen or 0) - self._tokens_before
            if seen > 0:
                self._metrics["tokens"] = seen / max(int(getattr(args, "world_size", 1)), 1)
            self._ended = int(state.global_step)
            if not control.should_log:
                self._close()
            if control.should_evaluate:
                self._hook.begin_pause("evaluation")
            if control.should_save:
                self._hook.begin_pause("checkpoint")
        except Exception as exc:
            self._error(exc)

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        try:
            self._hook.end_pause("evaluation")
        except Exception as exc:
            self._error(exc)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        try:
            self._hook.end_pause("checkpoint")
        except Exception as exc:
            self._error(exc)

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any
    ) -> None:
        try:
            if self._ended is None or not logs:
                return
            for key, name in _FROM_LOGS.items():
                value = scalar(logs.get(key))
                if value is not None:
                    self._metrics.setdefault(name, value)
            self._close()
        except Exception as exc:
            self._error(exc)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        try:
            self._close()
            self._end_pauses()
        except Exception as exc:
            self._error(exc)

    def _end_pauses(self) -> None:
        self._hook.end_pause("evaluation")
        self._hook.end_pause("checkpoint")

    def _close(self) -> None:
        if self._ended is not None:
            step, self._ended = self._ended, None
            self._hook.step_end(step, **self._metrics)
