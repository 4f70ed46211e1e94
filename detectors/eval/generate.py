"""Vectorised fault-injection traces: synchronous data-parallel telemetry with labels.

Each step every rank computes (``compute_ms``), waits for data (``data_wait_ms``) and
joins an all-reduce; the step ends when the slowest rank arrives, so a rank's
``comm_ms`` is its wait for the slowest plus its own transfer. Healthy jitter includes a
per-rank offset, per-step noise, a job-wide factor and periodic checkpoint steps that slow
every rank at once (which must not fire). Faults of every class of the taxonomy are
injected at random onsets, magnitudes and durations (see FAULT_KINDS and docs/trace-format.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from detectors.eval.trace import FaultWindow, Trace

METRICS = (
    "step_time",
    "compute_ms",
    "data_wait_ms",
    "comm_ms",
    "loss",
    "grad_norm",
    "tokens_per_s",
    "gpu_util",
    "gpu_temp",
    "sm_clock",
    "power",
    "mem_used",
    "nic_gbps",
    "host_cpu",
    "xid",
    "in_collective",
)
FAULT_KINDS = (
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
HARD_KINDS = frozenset({"hang", "xid", "loss_spike", "nan"})
FATAL_XIDS = (48, 79, 94, 95, 119, 120, 154)
_DURATION = {"hard": (1, 3), "slow": (30, 120)}
_M = {name: i for i, name in enumerate(METRICS)}


@dataclass(frozen=True)
class TraceSpec:
    """The shape of a generated trace.

    Args:
        nodes, ranks_per_node, replicas: the job layout (replicas split the ranks evenly).
        faults: kinds to inject, one window each, in a random order; empty for healthy.
        steps: length of a healthy trace (with faults, the length follows from them).
        checkpoint_every: steps between checkpoint steps that slow every rank.
        seed: everything random derives from it.
    """

    nodes: int = 8
    ranks_per_node: int = 8
    replicas: int = 2
    faults: Sequence[str] = FAULT_KINDS
    steps: int = 400
    checkpoint_every: int = 100
    seed: int = 0

    def __post_init__(self) -> None:
        unknown = set(self.faults) - set(FAULT_KINDS)
        if unknown:
            raise ValueError(f"unknown fault kind(s) {sorted(unknown)}; known: {FAULT_KINDS}")
        if self.nodes * self.ranks_per_node < 4:
            raise ValueError("a trace needs at least 4 ranks for peers to compare")


@dataclass(frozen=True)
class _Plan:
    kind: str
    start: int
    end: int
    rank: int
    node: int
    magnitude: float
    ticks: int = 0


def _plan(spec: TraceSpec, rng: np.random.Generator) -> tuple[list[_Plan], int]:
    """Non-overlapping fault windows with quiet gaps between them; returns them and T."""
    plans, step = [], 40
    n = spec.nodes * spec.ranks_per_node
    for kind in rng.permutation(list(spec.faults)):
        lo, hi = _DURATION["hard" if kind in HARD_KINDS else "slow"]
        length = 1 if kind in ("xid", "hang") else int(rng.integers(lo, hi + 1))
        plans.append(
            _Plan(
                str(kind),
                step,
                step + length - 1,
                int(rng.integers(n)),
                int(rng.integers(spec.nodes)),
                float(rng.random()),
                int(rng.integers(5, 16)),
            )
        )
        step += length + int(rng.integers(40, 70))
    return plans, max(step, spec.steps) if plans else spec.steps


def generate(spec: TraceSpec) -> Trace:
    """A labelled trace drawn from ``spec`` (same spec, same trace)."""
    rng = np.random.default_rng(spec.seed)
    plans, steps = _plan(spec, rng)
    n = spec.nodes * spec.ranks_per_node
    node_of = np.repeat(np.arange(spec.nodes), spec.ranks_per_node)
    base = _healthy(rng, steps, n, spec.checkpoint_every)
    for plan in plans:
        _inject(base, plan, node_of)
    _derive(base)
    return _assemble(spec, base, plans, node_of, rng)


def _healthy(rng: np.random.Generator, steps: int, n: int, every: int) -> dict[str, np.ndarray]:
    shape = (steps, n)
    job = 1.0 + 0.02 * rng.standard_normal((steps, 1))
    job[np.arange(steps) % every == every - 1] *= 2.5  # checkpoint steps slow every rank

    def around(level: float, rank_sd: float, step_sd: float) -> np.ndarray:
        offset = 1.0 + rank_sd * rng.standard_normal((1, n))
        return level * offset * (1.0 + step_sd * rng.standard_normal(shape))

    s = np.arange(steps)[:, None]
    return {
        "compute_ms": around(3000.0, 0.005, 0.015) * job,
        "data_wait_ms": np.abs(around(50.0, 0.05, 0.1)),
        "transfer_ms": around(500.0, 0.01, 0.02),
        "loss": (2.0 + 8.0 * np.exp(-s / 300.0)) * (1.0 + 0.01 * rng.standard_normal(shape)),
        "grad_norm": 1.0 + 0.05 * rng.standard_normal(shape),
        "gpu_util": np.clip(around(97.0, 0.005, 0.005), 0, 100),
        "gpu_temp": around(65.0, 0.02, 0.01),
        "sm_clock": around(1980.0, 0.002, 0.003),
        "power": around(600.0, 0.02, 0.02),
        "mem_used": around(60.0, 0.005, 0.001),
        "nic_gbps": around(40.0, 0.01, 0.02),
        "host_cpu": around(30.0, 0.05, 0.05),
        "xid": np.full(shape, np.nan),
        "nan": np.zeros(shape, dtype=bool),
    }


def _inject(b: dict[str, np.ndarray], p: _Plan, node_of: np.ndarray) -> None:
    w = slice(p.start, p.end + 1)
    rank, node = p.rank, node_of == p.node
    m = p.magnitude
    if p.kind == "slow_rank":
        b["compute_ms"][w, rank] *= 1.1 + 0.5 * m
    elif p.kind == "slow_node":
        b["compute_ms"][w, node] *= 1.1 + 0.5 * m
    elif p.kind == "nic_degradation":
        b["transfer_ms"][w, node] *= 1.5 + 2.5 * m
        b["nic_gbps"][w, node] /= 1.5 + 2.5 * m
    elif p.kind == "thermal":
        clock = 0.9 - 0.2 * m
        b["gpu_temp"][w, rank] += 8.0 + 17.0 * m
        b["sm_clock"][w, rank] *= clock
        b["compute_ms"][w, rank] /= clock
    elif p.kind == "memory_leak":
        b["mem_used"][w, rank] += (0.2 + 0.8 * m) * np.arange(1, p.end - p.start + 2)
    elif p.kind == "dataloader_stall":
        b["data_wait_ms"][w, rank] += 100.0 + 1400.0 * m
    elif p.kind == "xid":
        b["xid"][p.start, rank] = FATAL_XIDS[int(m * len(FATAL_XIDS)) % len(FATAL_XIDS)]
    elif p.kind == "loss_spike":
        b["loss"][w] *= 1.5 + 2.5 * m
        b["grad_norm"][w] *= 3.0 + 17.0 * m
    elif p.kind == "nan":
        b["nan"][w, rank] = True


def _derive(b: dict[str, np.ndarray]) -> None:
    """Synchronous-step quantities: step time, each rank's collective time, throughput."""
    busy = b["compute_ms"] + b["data_wait_ms"]
    slowest = busy.max(axis=1, keepdims=True)
    transfer = b["transfer_ms"].max(axis=1, keepdims=True)
    b["comm_ms"] = slowest - busy + b["transfer_ms"]
    step_ms = np.broadcast_to(slowest + transfer, busy.shape)
    b["step_time"] = step_ms / 1000.0
    b["tokens_per_s"] = 4096.0 * 8 / b["step_time"]
    b["loss"][b["nan"]] = np.nan
    b["grad_norm"][b["nan"]] = np.nan


def _assemble(
    spec: TraceSpec,
    b: dict[str, np.ndarray],
    plans: list[_Plan],
    node_of: np.ndarray,
    rng: np.random.Generator,
) -> Trace:
    steps, n = b["compute_ms"].shape
    dense = np.stack([b.get(m, np.full((steps, n), np.nan)) for m in METRICS], axis=2)
    present = np.ones(dense.shape, dtype=bool)
    present[:, :, _M["xid"]] = ~np.isnan(b["xid"])
    present[:, :, _M["in_collective"]] = False
    hang = {p.start: p for p in plans if p.kind == "hang"}
    order, durations, tick_values, tick_present, tick_steps = [], [], [], [], []
    nominal = float(np.median(b["step_time"]))
    for s in range(steps):
        if s in hang:
            for _ in range(hang[s].ticks):
                tick_values.append(_hang_tick(dense[s], hang[s].rank))
                tick_present.append(_hang_present(dense.shape[1:]))
                durations.append(nominal)
                tick_steps.append(s)
        order.append(len(tick_values))
        tick_values.append(dense[s])
        tick_present.append(present[s])
        durations.append(float(b["step_time"][s, 0]))
        tick_steps.append(s)
    times = 1.7e9 + np.cumsum(durations)
    labels = tuple(FaultWindow(p.kind, _label_subject(p, spec), p.start, p.end) for p in plans)
    ranks = np.arange(n)
    replicas = ranks * spec.replicas // n
    nodes = np.array([f"node{i:04d}" for i in node_of], dtype=object)
    mask = np.stack(tick_present)
    values = np.where(mask, np.stack(tick_values), np.nan)  # unreported values read as NaN
    return Trace(
        f"gen-{spec.seed}",
        ranks,
        nodes,
        replicas,
        METRICS,
        np.array(tick_steps),
        times,
        values,
        mask,
        labels,
    )


def _hang_tick(row: np.ndarray, culprit: int) -> np.ndarray:
    tick = row.copy()
    tick[:, _M["in_collective"]] = 1.0
    tick[culprit, _M["in_collective"]] = 0.0
    return tick


def _hang_present(shape: tuple[int, ...]) -> np.ndarray:
    """While hung, node pollers still report GPU metrics; no step completes."""
    mask = np.zeros(shape, dtype=bool)
    for name in ("gpu_util", "gpu_temp", "sm_clock", "power", "mem_used", "in_collective"):
        mask[:, _M[name]] = True
    return mask


def _label_subject(p: _Plan, spec: TraceSpec) -> str:
    if p.kind in ("slow_node", "nic_degradation"):
        return f"node:node{p.node:04d}"
    if p.kind == "loss_spike":
        return "job"
    return f"rank:{p.rank}"
