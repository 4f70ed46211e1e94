"""Recommend a fault-tolerance strategy, a redundancy and a checkpoint period for a job.

Simulates checkpoint-only, replication + checkpoint (r = 2…4 by default) and SPARe +
checkpoint (r around r*) with Saxena's period for each, and FT-HSDP's replica restart
(every failure stalls all for ``replica_stall_min``, then its replica rejoins after
``replica_rejoin_min``; no global restart), and picks the lowest TTT/T₀.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from ft_runtime.errors import FTRuntimeError
from ft_runtime.planner.config import ClusterConfig, Strategy
from ft_runtime.planner.intervals import ettr_replica
from ft_runtime.planner.replica_sim import ReplicaConfig, simulate_ettr
from ft_runtime.planner.sim import default_checkpoint, simulate
from ft_runtime.planner.spare_math import r_star, ttt_ratio
from ft_runtime.spare.errors import LayoutError
from ft_runtime.spare.layout import sidon_offsets

Progress = Callable[[str, float], None]


class PlanError(FTRuntimeError):
    """A plan request that cannot be simulated; the message names the bad value."""


@dataclass(frozen=True, slots=True)
class PlanRequest:
    """A job to plan for. ``n_groups`` None means one group per 1000 GPUs (at least 2)."""

    gpus: int
    gpu_mtbf_hours: float = 50_000.0
    n_groups: int | None = None
    restart_min: float = 60.0
    save_s: float = 60.0
    layer_s: float = 64.0
    allreduce_s: float | None = None
    steps: int = 10_000
    weibull_shape: float = 0.78
    seeds: int = 1
    replication_r: tuple[int, ...] = (2, 3, 4)
    spare_r: tuple[int, ...] | None = None
    replica_stall_min: float = 3.0
    replica_rejoin_min: float = 7.0

    def cluster(self) -> ClusterConfig:
        """The simulator's config; raises PlanError naming a bad value."""
        if self.gpus < 2 or self.gpu_mtbf_hours <= 0 or self.seeds < 1:
            raise PlanError(
                f"need --gpus >= 2, --gpu-mtbf-hours > 0 and --seeds >= 1; got {self.gpus}, "
                f"{self.gpu_mtbf_hours}, {self.seeds}"
            )
        n = self.n_groups or max(2, self.gpus // 1000)
        try:
            return ClusterConfig(
                gpus=self.gpus,
                n_groups=n,
                mtbf_s=self.gpu_mtbf_hours * 3600 / self.gpus,
                weibull_shape=self.weibull_shape,
                restart_s=self.restart_min * 60,
                save_s=self.save_s,
                layer_s=self.layer_s,
                allreduce_s=self.allreduce_s,
                steps=self.steps,
            )
        except ValueError as exc:
            raise PlanError(str(exc)) from exc


@dataclass(frozen=True, slots=True)
class PlanRow:
    """One simulated candidate (means over seeds)."""

    strategy: Strategy
    redundancy: int
    checkpoint_s: float
    ttt_ratio: float
    availability: float
    masked_per_wipe: float
    mean_stack: float
    completed: bool
    closed_form: float | None  # first-order J(r), where one exists


@dataclass(frozen=True, slots=True)
class Plan:
    """All candidates and the recommendation (the lowest TTT/T₀ among completed runs)."""

    cluster: ClusterConfig
    rows: tuple[PlanRow, ...]
    best: PlanRow


def candidates(cfg: ClusterConfig, req: PlanRequest) -> list[tuple[Strategy, int]]:
    """Checkpoint-only, replication degrees, and SPARe degrees that have a valid layout."""
    n = cfg.n_groups
    star = r_star(n)
    spare = req.spare_r or tuple(range(max(2, star - 3), star + 3))
    out = [(Strategy.CKPT, 1), (Strategy.FT_HSDP, 1)]
    out += [(Strategy.REPLICATION, r) for r in req.replication_r if 2 <= r <= n // 2]
    for r in spare:
        try:
            sidon_offsets(n, r)
        except LayoutError:
            continue
        out.append((Strategy.SPARE, r))
    return out


def _row(
    cfg: ClusterConfig,
    strategy: Strategy,
    r: int,
    seeds: int,
    progress: Callable[[float], None] | None,
) -> PlanRow:
    runs = []
    for seed in range(seeds):

        def tick(f: float, seed: int = seed) -> None:
            if progress is not None:
                progress((seed + f) / seeds)

        runs.append(simulate(cfg, strategy, r, seed=seed, progress=tick))
    m, ts, tr = cfg.mtbf_s, cfg.save_s, cfg.restart_s
    closed = (
        None
        if strategy is Strategy.CKPT
        else ttt_ratio(cfg.n_groups, r, m, ts, tr, replication=strategy is Strategy.REPLICATION)
    )
    return PlanRow(
        strategy,
        r,
        default_checkpoint(cfg, strategy, r),
        statistics.mean(x.ttt_ratio for x in runs),
        statistics.mean(x.availability for x in runs),
        statistics.mean(x.masked_per_wipe for x in runs),
        statistics.mean(x.mean_stack for x in runs),
        all(x.completed for x in runs),
        closed,
    )


def _replica_row(cfg: ClusterConfig, req: PlanRequest) -> PlanRow:
    rc = ReplicaConfig(
        replicas=cfg.n_groups,
        mtbf_s=cfg.mtbf_s,
        replica_stall_s=req.replica_stall_min * 60,
        degraded_s=req.replica_rejoin_min * 60,
        weibull_shape=cfg.weibull_shape,
    )
    ettr = statistics.mean(simulate_ettr(rc, replica_level=True, seed=s) for s in range(req.seeds))
    closed = 1 / max(1e-9, ettr_replica(cfg.mtbf_s, rc.replica_stall_s, rc.degraded_s, rc.replicas))
    return PlanRow(
        Strategy.FT_HSDP, 1, math.nan, 1 / max(ettr, 1e-9), ettr, math.nan, 1.0, ettr > 0, closed
    )


def make_plan(req: PlanRequest, progress: Progress | None = None) -> Plan:
    """Simulate every candidate and recommend one.

    Args:
        req: the job.
        progress: called as ``progress(label, fraction)`` while each candidate runs.

    Raises:
        PlanError: a bad request, or no candidate finished training.
    """
    cfg = req.cluster()
    rows = []
    for strategy, r in candidates(cfg, req):
        label = f"{strategy.value} r={r}"
        tick = None if progress is None else (lambda f, lab=label: progress(lab, f))
        if strategy is Strategy.FT_HSDP:
            rows.append(_replica_row(cfg, req))
            if tick is not None:
                tick(1.0)
            continue
        rows.append(_row(cfg, strategy, r, req.seeds, tick))
    done = [row for row in rows if row.completed]
    if not done:
        raise PlanError("no strategy finished training within the simulated horizon")
    return Plan(cfg, tuple(rows), min(done, key=lambda row: row.ttt_ratio))
