"""Control commands from the supervisor to the ranks of a replica-recovery job.

The supervisor writes command n under ``ctl/<n>`` in the quorum's store and counts them in
``ctl/count``. Every rank reports the count it has seen in its next exchange; the maximum
over the members is the agreed count, so every member runs the same commands after the
same step. Rank 0 of each replica answers under ``ctl/<n>/r<replica>`` with one of the
typed answers (saved, restored, skipped, refused, failed). The keys and the records live
in ``ft_runtime.replica.protocol``; this module keeps the names it always exported.
"""

from __future__ import annotations

from ft_runtime.replica.protocol import (
    CHECKPOINT,
    COMMAND_KINDS,
    KEY_COMMANDS,
    ROLLBACK,
    SKIP_BATCH,
    Command,
    key_answer,
    key_command,
)

KINDS = COMMAND_KINDS

__all__ = [
    "CHECKPOINT",
    "KEY_COMMANDS",
    "KINDS",
    "ROLLBACK",
    "SKIP_BATCH",
    "Command",
    "key_answer",
    "key_command",
]
