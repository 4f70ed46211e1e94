"""A metric no detector knows is watched against its peers, with no code."""

from __future__ import annotations

import numpy as np

from collector.types import Frame, Subject
from detectors.config import DetectorsConfig
from detectors.generic import GenericPeer, watchable
from tests.detectors._batches import batch


def test_a_user_metric_that_leaves_its_peers_is_named() -> None:
    det = GenericPeer(warmup=0)
    rng = np.random.default_rng(0)
    found = []
    for s in range(60):
        depth = 40.0 * (1.0 + 0.05 * rng.standard_normal(16))
        if s >= 30:
            depth[11] *= 0.5  # rank 11's queue runs dry: lower is bad here, nobody said so
        found += det.process_step(batch(s, {"my_queue_depth": depth}))
    assert [(f.kind, f.subject.rank) for f in found] == [("metric_outlier", 11)]
    assert "my_queue_depth" in found[0].evidence
    assert 30 <= (found[0].step or 0) <= 45


def test_noisy_healthy_metrics_and_metrics_read_elsewhere_are_left_alone() -> None:
    det = GenericPeer(warmup=0)
    rng = np.random.default_rng(1)
    for s in range(300):
        columns = {
            "power": 600.0 * (1.0 + 0.02 * rng.standard_normal(16)),
            "compute_ms": np.where(np.arange(16) == 3, 500.0, 100.0),  # the peer detector's
            "section.forward": np.where(np.arange(16) == 3, 5.0, 1.0),  # part of compute_ms
            "lr": np.full(16, 3e-4),
        }
        assert not det.process_step(batch(s, columns))
    assert det.core.names == ["power", "lr"]
    assert not watchable("exit_code")
    assert not watchable("step_time.max")
    assert watchable("gpu_util")
    assert watchable("ecc_sbe_rate")  # a counter's rate no rule reads
    assert not watchable("nic_rx_errors_rate")  # the peer detector's


def test_the_default_pipeline_watches_a_metric_fed_frame_by_frame() -> None:
    pipeline = DetectorsConfig().build()
    found = []
    for s in range(60):
        for r in range(8):
            value = 900.0 if r == 5 and s >= 30 else 100.0 + r
            frame = Frame(Subject(0, r, f"n{r // 4}"), s, float(s), {"tokens_in_flight": value})
            found += pipeline.process(frame)
    found += pipeline.flush()
    assert [(f.kind, f.subject.rank) for f in found] == [("metric_outlier", 5)]
