"""The defaults of replica recovery, in one torch-free place.

The quorum, the replica supervisor, ``eagleeye run``'s flags and its job configuration all
read their defaults from here, so a default changes in one line and the command line can
show it without importing torch.

>>> DEFAULTS.stall_factor, DEFAULTS.command_timeout_s
(1.0, 30.0)
>>> ReplicaConfig(stall_factor=0)
Traceback (most recent call last):
...
ValueError: replica stall_factor 0 must be > 0
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

__all__ = [
    "COMMAND_TIMEOUT_S",
    "DEFAULTS",
    "JOINER_NICE",
    "LATENESS_FACTOR",
    "MAX_JOB_RESTARTS",
    "MAX_RESTARTS",
    "MIN_REPLICAS",
    "SERVE_NICE",
    "STALL_FACTOR",
    "STALL_FLOOR_S",
    "STRAGGLER_FACTOR",
    "ReplicaConfig",
]

STALL_FACTOR = 1.0
"""A member that has not entered the exchange while the others waited this many median
step times is hung (unless the noise guard says otherwise)."""
STALL_FLOOR_S = 0.05
"""Least waiting time that counts as a stall, whatever the pace."""
LATENESS_FACTOR = 2.0
"""The noise guard: the stall limit is at least this many times the worst recent lateness."""
STRAGGLER_FACTOR = 5.0
"""A late rank that still runs is given up to this many stall limits before it is hung."""
MIN_REPLICAS = 1
"""Fewer healthy replicas than this and the whole job restarts from its newest checkpoint."""
MAX_RESTARTS = 3
"""Restart budget of each replica (and of the job, under ``--recovery job``)."""
MAX_JOB_RESTARTS = 1
"""Full-job restarts from the newest checkpoint, the last resort of replica recovery."""
COMMAND_TIMEOUT_S = 30.0
"""How long a control command (checkpoint, rollback, skip_batch) waits for its answers."""
JOINER_NICE = 10
"""How much lower a relaunched replica's ranks run until they caught up (0: not at all)."""
SERVE_NICE = 10
"""How much lower a source's catch-up server threads run than its training thread."""


@dataclass(frozen=True, slots=True)
class ReplicaConfig:
    """The settings of replica recovery; each defaults to the constant of its name."""

    stall_factor: float = STALL_FACTOR
    stall_floor_s: float = STALL_FLOOR_S
    lateness_factor: float = LATENESS_FACTOR
    straggler_factor: float = STRAGGLER_FACTOR
    min_replicas: int = MIN_REPLICAS
    max_restarts: int = MAX_RESTARTS
    max_job_restarts: int = MAX_JOB_RESTARTS
    command_timeout_s: float = COMMAND_TIMEOUT_S
    joiner_nice: int = JOINER_NICE
    serve_nice: int = SERVE_NICE

    def __post_init__(self) -> None:
        for name in ("stall_factor", "lateness_factor", "straggler_factor", "command_timeout_s"):
            _check(name, getattr(self, name), positive=True)
        for name in ("stall_floor_s", "max_restarts", "max_job_restarts"):
            _check(name, getattr(self, name), positive=False)
        _check("min_replicas", self.min_replicas, positive=True)
        for name in ("joiner_nice", "serve_nice"):
            value = getattr(self, name)
            if not 0 <= value <= 19:
                raise ValueError(f"replica {name} {value} must be a nice increment in 0..19")

    def as_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _check(name: str, value: float, positive: bool) -> None:
    bad = not math.isfinite(value) or (value <= 0 if positive else value < 0)
    if bad:
        raise ValueError(f"replica {name} {value:g} must be {'> 0' if positive else '>= 0'}")


DEFAULTS = ReplicaConfig()
"""Replica recovery as it runs when nothing is set."""
