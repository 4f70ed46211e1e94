"""The controller compares the hosts' medians with each other (``HostPeers``): a node whose
every rank is 10 % slower (no rank of it stands out on its host, and the host is under the
node frames' 20 % bar) is a ``slow_node`` finding on that node within 20 steps, while the
job is quiet; on a noisy host nothing is claimed. The steps go the real way: each host's
ranks summarised (``summarise``), sealed, taken by the intake and reduced."""

from __future__ import annotations

import numpy as np
import pytest

from collector.types import Subject
from eagleeye.agents.intake import SummaryIntake
from eagleeye.agents.judging import ReducedJudge
from eagleeye.agents.summary import encode_summary, parse_summary, summarise
from eagleeye.store import RunStore
from ft_runtime.layout import JobLayout

KEY = b"0123456789abcdef0123456789abcdef"
SESSION = "0011223344556677"


def _job(tmp_path, jitter: float, slow_node: int, slow_from: int, layout: JobLayout, compare=True):
    """Ranks in lockstep (8 a host): each computes (its GPU's own speed, noise of
    ``jitter``) and waits in the all-reduce for the slowest; every rank of ``slow_node``
    computes 10 % longer from ``slow_from``. Returns the judge's findings."""
    rng = np.random.default_rng(11)
    n = layout.world_size
    speed = 1.0 + 0.015 * rng.standard_normal(n)
    intake = SummaryIntake(layout, clock=lambda: 0.0)
    store = RunStore(tmp_path)
    judge = ReducedJudge(store, layout if compare else None)
    found = []
    try:
        for step in range(120):
            compute = 200.0 * speed * np.exp(jitter * rng.standard_normal(n))
            if step >= slow_from:
                compute[slow_node * 8 : slow_node * 8 + 8] *= 1.1
            step_s = (compute.max() + 20.0) / 1e3
            for node in range(layout.nnodes):
                values = {
                    r: {
                        "step_time": step_s,
                        "compute_ms": compute[r],
                        "comm_ms": step_s * 1e3 - compute[r] - 1.0,
                        "data_wait_ms": 1.0,
                    }
                    for r in range(node * 8, node * 8 + 8)
                }
                sealed = encode_summary(summarise(step, 0, values), KEY, SESSION, step + 1)
                intake.take(node, parse_summary(KEY, *sealed), 0, 0.0)
            frames = intake.frames(hosts=layout.nnodes)
            found += judge.judge(frames, float(step), intake.take_medians())
    finally:
        store.close()
    return found


@pytest.mark.parametrize("replicas", [1, 4])
def test_a_node_ten_per_cent_slower_is_found_against_the_other_hosts(tmp_path, replicas) -> None:
    layout = JobLayout(nnodes=8, nproc_per_node=8, replicas=replicas)
    found = _job(tmp_path, jitter=0.01, slow_node=5, slow_from=60, layout=layout)
    assert [(f.kind, f.subject) for f in found] == [
        ("slow_node", Subject(replica=5 * replicas // 8, node="node5"))
    ]
    assert found[0].detector == "hosts:peer_outlier/quiet"
    assert 60 < (found[0].step or 0) <= 80


def test_a_node_of_two_replicas_names_no_replica(tmp_path) -> None:
    layout = JobLayout(nnodes=4, nproc_per_node=8, replicas=8)  # 4 ranks a replica
    found = _job(tmp_path, jitter=0.01, slow_node=2, slow_from=60, layout=layout)
    assert [(f.kind, f.subject) for f in found] == [("slow_node", Subject(node="node2"))]


def test_hosts_of_a_noisy_job_are_not_compared(tmp_path) -> None:
    layout = JobLayout(nnodes=8, nproc_per_node=8)
    assert _job(tmp_path, jitter=0.3, slow_node=5, slow_from=60, layout=layout) == []


def test_without_the_comparison_of_hosts_the_slow_node_goes_unseen(tmp_path) -> None:
    # The controller's other detectors: a rank against its host's median, the job's step
    # time doubled; the node frames name a host 20 % off the others.
    layout = JobLayout(nnodes=8, nproc_per_node=8)
    assert _job(tmp_path, 0.01, slow_node=5, slow_from=60, layout=layout, compare=False) == []
