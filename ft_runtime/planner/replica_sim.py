"""Effective training time of synchronous recovery against replica-level recovery (FT-HSDP).

A SimPy model of R data-parallel replicas on a cluster that fails every MTBF on average.
Synchronous recovery stalls every replica for the whole recovery. Replica-level recovery
stalls everyone only briefly (detection, handling, retrain of the step), then trains on with
R − 1 replicas while the failed one restarts and catches up. Recoveries are served one at a
time, so a failure that lands in another's recovery waits for it: lost time per failure is
then exactly the stall, and the long-run ETTR is the closed form's (MTBF − lost) / MTBF.
"""

from __future__ import annotations

import math
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

import numpy as np
import simpy


@dataclass(frozen=True, slots=True)
class ReplicaConfig:
    """FT-HSDP's production setting by default (times in seconds).

    Attributes:
        replicas: R data-parallel replicas.
        mtbf_s: cluster MTBF.
        sync_stall_s: a synchronous (whole-job) recovery.
        replica_stall_s: the whole-job stall of a replica-level recovery.
        degraded_s: how long the failed replica stays out after that stall.
        weibull_shape: shape of the inter-failure gaps (1.0 = exponential).
        failures: how many failures to simulate (the run's length).
    """

    replicas: int = 12
    mtbf_s: float = 18 * 60
    sync_stall_s: float = 10 * 60
    replica_stall_s: float = 3 * 60
    degraded_s: float = 7 * 60
    weibull_shape: float = 1.0
    failures: int = 4000

    def __post_init__(self) -> None:
        if self.replicas < 1 or self.mtbf_s <= 0 or self.failures < 1:
            raise ValueError("replicas, mtbf_s and failures must be positive")
        if min(self.sync_stall_s, self.replica_stall_s, self.degraded_s) < 0:
            raise ValueError("stall and degraded times must not be negative")


class _Cluster:
    def __init__(self, env: simpy.Environment, cfg: ReplicaConfig, replica_level: bool) -> None:
        self.env, self.cfg, self.replica_level = env, cfg, replica_level
        self.recovery = simpy.Resource(env, capacity=1)
        self.stalled = 0
        self.down = 0
        self.work = 0.0  # replica-seconds of training, normalised by R below
        self._since = 0.0

    def _account(self) -> None:
        # Integrate throughput over the interval since the last state change.
        rate = 0.0 if self.stalled else (self.cfg.replicas - self.down) / self.cfg.replicas
        self.work += rate * (self.env.now - self._since)
        self._since = self.env.now

    def _set(self, stalled: int = 0, down: int = 0) -> None:
        self._account()
        self.stalled += stalled
        self.down += down

    def recover(self) -> Generator[simpy.Event, Any, None]:
        stall = self.cfg.replica_stall_s if self.replica_level else self.cfg.sync_stall_s
        with self.recovery.request() as req:
            yield req
            self._set(stalled=1)
            yield self.env.timeout(stall)
            self._set(stalled=-1)
        if self.replica_level and self.cfg.degraded_s > 0:
            self._set(down=1)
            yield self.env.timeout(self.cfg.degraded_s)
            self._set(down=-1)

    def failures(self, rng: np.random.Generator) -> Generator[simpy.Event, Any, None]:
        k = self.cfg.weibull_shape
        scale = self.cfg.mtbf_s / math.gamma(1 + 1 / k)  # so the mean gap is the MTBF
        for _ in range(self.cfg.failures):
            yield self.env.timeout(scale * rng.weibull(k))
            self.env.process(self.recover())


def simulate_ettr(cfg: ReplicaConfig, *, replica_level: bool, seed: int = 0) -> float:
    """Effective training time ratio: training done / (wall clock × full throughput).

    Args:
        cfg: replicas, MTBF and recovery costs.
        replica_level: True for FT-HSDP's replica restart, False for synchronous recovery.
        seed: random seed.
    """
    env = simpy.Environment()
    cluster = _Cluster(env, cfg, replica_level)
    env.process(cluster.failures(np.random.default_rng(seed)))
    env.run()
    cluster._account()
    return cluster.work / env.now
