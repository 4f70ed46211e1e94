"""What a simulated job is and which faults befall it, when, where and how badly."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

FLEET_FAULTS = (
    "slow_rank",
    "slow_node",
    "nic_degradation",
    "thermal",
    "memory_leak",
    "dataloader_stall",
    "hang",
    "xid",
    "loss_spike",
    "nan",
)
#: Faults that last many steps; their size is drawn with most mass near the smallest.
LASTING = frozenset({"slow_rank", "slow_node", "nic_degradation", "thermal", "dataloader_stall"})
#: Fatal XIDs a GPU may report.
XIDS = (48, 62, 79, 92, 94, 95, 119, 120)


@dataclass(frozen=True)
class FleetSpec:
    """The simulated job.

    Args:
        nodes, gpus_per_node: the hosts and the GPUs (ranks) on each.
        replicas: data-parallel replicas the ranks are split into (labels only: every rank
            joins one synchronous all-reduce per step).
        faults: fault kinds to befall the job, one each, in a random order.
        steps: the job's length in steps (at least; the faults may need more).
        seed: everything random derives from it.
        sizes: fault kind -> a size to use instead of drawing one (``Fault.size``).
    """

    nodes: int = 8
    gpus_per_node: int = 8
    replicas: int = 2
    faults: Sequence[str] = FLEET_FAULTS
    steps: int = 600
    seed: int = 0
    sizes: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.faults) - set(FLEET_FAULTS))
        if unknown:
            raise ValueError(f"unknown fault kind(s) {unknown}; known: {', '.join(FLEET_FAULTS)}")
        if self.nodes < 2 or self.nodes * self.gpus_per_node < 8:
            raise ValueError("the simulated job needs at least 2 nodes and 8 GPUs")

    @property
    def ranks(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True)
class Fault:
    """One planned fault: its kind, first step, steps it lasts, where, and its size.

    ``size`` is the fault's own measure: the relative slowdown (0.1 = 10 %), the share of
    bandwidth lost, the clock lost, the data wait added in step times, the loss factor,
    or the steps a leak takes to fill the GPU. ``hold_s`` is how long a hang freezes the
    job before it is killed; ``code`` is an XID.
    """

    kind: str
    step: int
    length: int
    rank: int
    node: int
    size: float
    hold_s: float = 0.0
    code: int = 0

    def covers(self, step: int) -> bool:
        return self.step <= step < self.step + self.length


def plan_faults(spec: FleetSpec, rng: np.random.Generator) -> tuple[list[Fault], int]:
    """The faults in the order they strike, with quiet stretches between them, and the
    job's length in steps."""
    faults, step = [], int(rng.integers(70, 100))
    for kind in rng.permutation(list(spec.faults)):
        fault = _draw(str(kind), step, spec, rng)
        if fault.kind in spec.sizes:
            fault = replace(fault, size=float(spec.sizes[fault.kind]))
        faults.append(fault)
        step = fault.step + fault.length + int(rng.integers(50, 90))
    return faults, max(step, spec.steps)


def _draw(kind: str, step: int, spec: FleetSpec, rng: np.random.Generator) -> Fault:
    rank, node = int(rng.integers(spec.ranks)), int(rng.integers(spec.nodes))
    u = float(rng.random())
    if kind in LASTING:
        length = int(rng.integers(25, 101))
        size = {
            "slow_rank": 0.10 + 0.40 * u * u,
            "slow_node": 0.10 + 0.40 * u * u,
            "nic_degradation": 0.10 + 0.60 * u * u,
            "thermal": 0.10 + 0.20 * u,
            "dataloader_stall": 0.10 + 1.90 * u * u,
        }[kind]
        return Fault(kind, step, length, rank, node, size)
    if kind == "memory_leak":
        length = int(rng.integers(60, 251))  # steps until the GPU is full
        return Fault(kind, step, length, rank, node, float(length))
    if kind == "hang":
        return Fault(kind, step, 1, rank, node, 0.0, hold_s=float(rng.uniform(60.0, 600.0)))
    if kind == "xid":
        return Fault(kind, step, 1, rank, node, 0.0, code=int(rng.choice(XIDS)))
    if kind == "loss_spike":
        return Fault(kind, step, int(rng.integers(1, 5)), rank, node, 1.4 + 3.6 * u)
    return Fault(kind, step, int(rng.integers(1, 3)), rank, node, 0.0)  # nan
