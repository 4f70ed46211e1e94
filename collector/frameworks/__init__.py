"""Optional callbacks that feed a framework's training loop into the in-loop hook.

Importing this package imports neither framework: each factory imports its framework when
called and names the extra to install when it is missing. Both report what the in-loop
hook reports per optimizer step: step start and end (so ``step_time``), ``loss``,
``grad_norm``, ``lr`` and ``tokens``.
"""

from __future__ import annotations

from collector.frameworks.common import MissingFrameworkError, StepHook, count_tokens
from collector.frameworks.hf_callback import hf_callback
from collector.frameworks.lightning_callback import lightning_callback

__all__ = [
    "MissingFrameworkError",
    "StepHook",
    "count_tokens",
    "hf_callback",
    "lightning_callback",
]
