"""The planner: closed forms, a Monte-Carlo of the SPARe layout and SimPy simulators.

Needs the ``planner`` extra (simpy, scipy, networkx, matplotlib).
"""

from __future__ import annotations

from ft_runtime.planner.config import ClusterConfig, SimResult, Strategy
from ft_runtime.planner.epochs import NoRedundancy, Replication, Scheme, Spare, monte_carlo
from ft_runtime.planner.intervals import (
    availability,
    best_availability,
    daly_first_order,
    daly_higher_order,
    daly_wall_time,
    ettr_replica,
    ettr_synchronous,
    saxena_interval,
    young,
)
from ft_runtime.planner.replica_sim import ReplicaConfig, simulate_ettr
from ft_runtime.planner.sim import default_checkpoint, simulate
from ft_runtime.planner.spare_math import c, mu, mu_replication, r_star, sbar_lower, ttt_ratio

__all__ = [
    "ClusterConfig",
    "NoRedundancy",
    "ReplicaConfig",
    "Replication",
    "Scheme",
    "SimResult",
    "Spare",
    "Strategy",
    "availability",
    "best_availability",
    "c",
    "daly_first_order",
    "daly_higher_order",
    "daly_wall_time",
    "default_checkpoint",
    "ettr_replica",
    "ettr_synchronous",
    "monte_carlo",
    "mu",
    "mu_replication",
    "r_star",
    "saxena_interval",
    "sbar_lower",
    "simulate",
    "simulate_ettr",
    "ttt_ratio",
    "young",
]
