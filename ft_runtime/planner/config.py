"""Configuration of the training-cluster simulator (times in seconds)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum


class Strategy(StrEnum):
    """Fault-tolerance strategies the simulator compares."""

    CKPT = "ckpt"  # checkpoint-only: every failure is a global restart
    REPLICATION = "replication"  # r-way replica sets + checkpoint
    SPARE = "spare"  # SPARe stacked layout + checkpoint
    FT_HSDP = "ft-hsdp"  # replica restart with peer catch-up (replica_sim), no global restart


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """A training job on a failing cluster. Defaults: SPARe's 600k-GPU setup, N = 600.

    Attributes:
        gpus: GPUs in the job (reporting only; failures are drawn per group).
        n_groups: N data-parallel groups.
        mtbf_s: system MTBF m with every group up (dead groups stop failing).
        weibull_shape: shape k of the inter-failure distribution (1.0 = exponential).
        restart_s: global restart from a checkpoint, T_r.
        save_s: blocking checkpoint save, T_s.
        layer_s: compute time of one stack layer, T_comp.
        allreduce_s: DP all-reduce time T_a; None means 0.01 s per group (2–10 s for
            N = 200–1000, as the paper's range grows with N).
        jitter: relative standard deviation of every duration (× N(1, jitter²)).
        steps: training steps to finish.
        controller_s, shrink_s: ReCtlr and communicator-shrink cost per masked failure.
        detect_s: failure-detection latency per masked failure.
        give_up: stop a run that has not finished after this many T₀ (CKPT-only at scale).
        carry_restart_failures: groups that fail during a global restart stay down in the
            next epoch (a restart cannot wait for their replacement without starting over);
            False lets the restart replace them at no cost.
        max_restart_attempts: give up after this many restarts in a row fail.
        failure_model: how failures arrive (each failure hits one live group):
            "fresh" (default): every group has a Weibull lifetime of mean N·m, and a global
            restart restarts every clock, so with k < 1 failures bunch up right after a
            restart; this is the model that reproduces the paper's table.
            "group": the same lifetimes, renewed only for the groups a restart replaces.
            "system": one renewal process of Weibull gaps with mean m·N/N_alive.
    """

    gpus: int = 600_000
    n_groups: int = 600
    mtbf_s: float = 300.0
    weibull_shape: float = 0.78
    restart_s: float = 3600.0
    save_s: float = 60.0
    layer_s: float = 64.0
    allreduce_s: float | None = None
    jitter: float = 0.05
    steps: int = 10_000
    controller_s: float = 0.1
    shrink_s: float = 0.1
    detect_s: float = 0.0
    give_up: float = 30.0
    carry_restart_failures: bool = True
    max_restart_attempts: int = 1000
    failure_model: str = "fresh"

    def __post_init__(self) -> None:
        positive = {
            "gpus": self.gpus,
            "n_groups": self.n_groups,
            "mtbf_s": self.mtbf_s,
            "weibull_shape": self.weibull_shape,
            "layer_s": self.layer_s,
            "steps": self.steps,
            "give_up": self.give_up,
            "max_restart_attempts": self.max_restart_attempts,
        }
        bad = [f"{k}={v}" for k, v in positive.items() if not v > 0]
        if bad:
            raise ValueError(f"must be positive: {', '.join(bad)}")
        if self.n_groups < 2 or self.gpus < self.n_groups:
            raise ValueError(f"need 2 <= n_groups <= gpus, got {self.n_groups}, {self.gpus}")
        if self.failure_model not in ("system", "group", "fresh"):
            raise ValueError(
                f"failure_model must be 'system', 'group' or 'fresh', got {self.failure_model!r}"
            )
        if self.failure_model != "system" and not self.carry_restart_failures:
            raise ValueError(f"failure_model={self.failure_model!r} needs carry_restart_failures")
        if min(self.restart_s, self.save_s, self.jitter, self.detect_s) < 0:
            raise ValueError("restart_s, save_s, jitter and detect_s must not be negative")

    @property
    def t_allreduce(self) -> float:
        return 0.01 * self.n_groups if self.allreduce_s is None else self.allreduce_s

    @property
    def t0(self) -> float:
        """Failure-free time-to-train: one layer and one all-reduce per step, no saves."""
        return self.steps * (self.layer_s + self.t_allreduce)

    @property
    def weibull_mean(self) -> float:
        """Mean of a unit-scale Weibull of this shape: Γ(1 + 1/k)."""
        return math.gamma(1 + 1 / self.weibull_shape)


@dataclass(frozen=True, slots=True)
class SimResult:
    """What one simulated training run cost.

    Attributes:
        ttt_ratio: time-to-train over T₀ (infinite when the run gave up).
        availability: productive time / wall clock: restarts, saves and rolled-back work
            count as unavailable (the quantity Saxena's A(T_c) models).
        uptime: 1 − restart time / wall clock.
        masked_per_wipe: group failures masked per wipe-out (μ, measured).
        mean_stack: time-averaged stack number of training steps.
    """

    strategy: Strategy
    redundancy: int
    checkpoint_s: float
    ttt_s: float
    ttt_ratio: float
    availability: float
    uptime: float
    failures: int
    wipe_outs: int
    masked_per_wipe: float
    mean_stack: float
    completed: bool
