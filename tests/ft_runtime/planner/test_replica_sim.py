from __future__ import annotations

import statistics

import pytest

from ft_runtime.planner.intervals import ettr_replica, ettr_synchronous
from ft_runtime.planner.replica_sim import ReplicaConfig, simulate_ettr


def test_ft_hsdp_effective_training_time_44_against_80_percent() -> None:
    cfg = ReplicaConfig()  # 12 replicas, MTBF 18 min, 10 min sync vs 3 + 7 min replica
    sync = statistics.mean(simulate_ettr(cfg, replica_level=False, seed=s) for s in range(3))
    ft = statistics.mean(simulate_ettr(cfg, replica_level=True, seed=s) for s in range(3))
    assert sync == pytest.approx(0.44, abs=0.02)
    assert ft == pytest.approx(0.80, abs=0.02)
    assert sync == pytest.approx(ettr_synchronous(18, 10), abs=0.02)
    assert ft == pytest.approx(ettr_replica(18, 3, 7, 12), abs=0.02)


def test_more_replicas_lose_less_while_one_is_missing() -> None:
    few = simulate_ettr(ReplicaConfig(replicas=2, replica_stall_s=0), replica_level=True)
    many = simulate_ettr(ReplicaConfig(replicas=48, replica_stall_s=0), replica_level=True)
    assert few < many


def test_bad_replica_config() -> None:
    with pytest.raises(ValueError, match="must not be negative"):
        ReplicaConfig(degraded_s=-1)
