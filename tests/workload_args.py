"""The reference workload's arguments for short test runs."""

from __future__ import annotations


def tiny_workload(steps: int, checkpoint_every: int) -> list[str]:
    """The ``tiny`` GPT, batch 2 × 32, for ``steps`` steps with a checkpoint every
    ``checkpoint_every``."""
    return [
        *("--preset", "tiny", "--steps", str(steps)),
        *("--batch-size", "2", "--block-size", "32"),
        *("--checkpoint-every", str(checkpoint_every)),
    ]
