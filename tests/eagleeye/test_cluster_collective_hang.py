"""A rank blocked (not stopped) while its peers wait in a collective, across hosts
(loopback, two agents): the reference workload's rank 3 (two ranks a host), on host B,
sleeps at a step before its all-reduce (an injected ``slow`` fault of 100 s); host B's
agent reports it running, its main thread gaining no CPU time, and rank 2 waiting, host
A's its ranks waiting; the controller answers with one hang on rank 3 and node1 once it
has been idle for --hang-idle-s, the three waiting ranks in its evidence, restarts the
job, which succeeds. A rank busy outside the collective for 15 s (a checkpoint save or an
evaluation not declared as a pause) while its peer waits is working: no hang, no action.
A job whose ranks pause (one, or all) or wait whole in a collective draws no hang and no
action, and its hosts say nothing at the steps in between; a healthy job draws no hang
and no progress report."""

from __future__ import annotations

from pathlib import Path

import pytest

from eagleeye.store import RunReader
from tests.eagleeye.test_cluster_cli import Cluster
from tests.eagleeye.test_cluster_hang import LOOP_HEAD

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(240)]

WORKLOAD = """
import sys
from eagleeye.workload.train import main
main(["--steps", sys.argv[1], "--checkpoint-every", "0", "--timeout-s", "150",
      "--preset", "tiny"])
"""

#: the loop's tail: the all-reduce timed as a collective
TAIL = """
    t = torch.ones(4)
    with ee.collective("all_reduce"):
        dist.all_reduce(t)
    ee.step_end(i, loss=float(t[0]))
ee.close()
dist.destroy_process_group()
"""

PAUSES = (
    LOOP_HEAD
    + """    if i == 10 and ee.rank == 0:  # rank 0 validates; rank 1 waits
        with ee.pause("validation"):
            time.sleep(8)
    if i == 20:  # every rank waits in one collective
        with ee.collective("barrier"):
            time.sleep(8)
    if i == 30:  # every rank saves a checkpoint
        with ee.pause("checkpoint"):
            time.sleep(8)
"""
    + TAIL
)


BUSY = (
    LOOP_HEAD
    + """    if i == 10 and ee.rank == 1:  # 15 s of work, no pause declared; rank 0 waits
        end = time.monotonic() + 15
        while time.monotonic() < end:
            pass
"""
    + TAIL
)
#: a small idle limit, so that only the CPU time the rank gains keeps it from a verdict
IDLE = ("--remediate", "--hang-idle-s", "3")


def _findings_to_success(cluster: Cluster) -> list[dict]:
    """The findings the controller printed until the job succeeded (and it exited 0)."""
    findings: list[dict] = []
    cluster.launched({0, 1}, 0)

    def end(item: dict) -> bool:
        if item.get("type") == "Finding":
            findings.append(item)
        return item.get("subject") == "job" and item.get("phase") in ("succeeded", "failed")

    assert cluster.read(end)["phase"] == "succeeded"
    assert cluster.controller.wait(timeout=30) == 0
    return findings


def test_a_rank_asleep_before_its_collective_is_one_hang_and_the_job_restarts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EAGLEEYE_INJECT", "slow:rank=3@step=12,seconds=100,steps=1")
    cluster = Cluster(tmp_path, "30", nproc=2, script=WORKLOAD, controller=IDLE)
    try:
        cluster.launched({0, 1, 2, 3}, 0)
        finding = cluster.read(lambda i: i.get("type") == "Finding")
        assert (finding["kind"], finding["subject"]["rank"]) == ("hang", 3)
        assert finding["subject"]["node"] == "node1"
        assert finding["severity"] == "critical"
        evidence = finding["evidence"]
        assert (evidence["collective_wait"], evidence["idle"]) == (1.0, 1.0)
        assert evidence["culprit_rank_0"] == 3.0
        assert evidence["idle_s"] >= evidence["idle_limit_s"] >= 3.0  # at least the silence limit
        assert evidence["culprit_cpu_s_0"] > 0.0  # the CPU time of its main thread, unchanged
        assert [evidence[f"waiting_rank_{i}"] for i in range(3)] == [0.0, 1.0, 2.0]
        assert (evidence["ranks_waiting"], evidence["ranks_unknown"]) == (3.0, 0.0)
        assert evidence["last_step"] == 11.0
        cluster.launched({0, 1, 2, 3}, 1)
        assert cluster.ended()["phase"] == "succeeded"
        assert cluster.controller.wait(timeout=30) == 0
    finally:
        cluster.close()
    cluster.no_rank_left()
    with RunReader(tmp_path / "runs" / "r") as run:
        findings = run.query("SELECT kind, rank, node FROM findings ORDER BY id")
        actions = run.query("SELECT kind, target, status, dry_run FROM actions ORDER BY id")
        told = run.query("SELECT name, rank FROM samples WHERE name LIKE 'progress.%'")
    assert list(findings.itertuples(index=False, name=None)) == [("hang", 3, "node1")]
    assert list(actions.itertuples(index=False, name=None)) == [("restart", "job", "done", 0)]
    assert {("progress.running", 3), ("progress.waiting", 2), ("progress.waiting", 0)} <= set(
        told.itertuples(index=False, name=None)
    )


def test_a_rank_busy_outside_the_collective_while_its_peer_waits_is_no_hang(
    tmp_path: Path,
) -> None:
    cluster = Cluster(tmp_path, "20", script=BUSY, controller=IDLE)
    try:
        findings = _findings_to_success(cluster)
    finally:
        cluster.close()
    cluster.no_rank_left()
    assert findings == []
    with RunReader(tmp_path / "runs" / "r") as run:
        actions = run.query("SELECT kind FROM actions")
        told = run.query("SELECT name, rank, value FROM samples WHERE name LIKE 'progress.%'")
        cpu = run.query("SELECT value FROM samples WHERE name = 'proc_cpu_s' AND rank = 1")
    assert actions.empty
    states = set(zip(told["name"], told["rank"], strict=True))
    assert {("progress.running", 1), ("progress.waiting", 0)} <= states
    # its host looked again and again (1 s apart at least, from half the 5 s silence limit:
    # past the limit, the controller judged it), and it gained CPU time
    looks = list(cpu["value"])
    assert len(looks) >= 5
    assert looks[-1] - looks[0] >= 2.0


def test_pauses_and_a_job_waiting_whole_draw_no_hang_and_no_action(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, "40", script=PAUSES, controller=("--remediate",))
    try:
        findings = _findings_to_success(cluster)
    finally:
        cluster.close()
    cluster.no_rank_left()
    # the job waiting whole in the barrier is reported, nothing else
    assert [(f["kind"], f["severity"]) for f in findings] == [("collective_stall", "warn")]
    assert findings[0]["evidence"]["ranks_waiting"] == 2.0
    with RunReader(tmp_path / "runs" / "r") as run:
        actions = run.query("SELECT kind FROM actions")
        told = run.query("SELECT name, rank, step FROM samples WHERE name LIKE 'progress.%'")
    assert actions.empty
    # the hosts spoke only around the three stalls (the step before each, and its end)
    assert set(told["step"]) <= {9, 10, 19, 20, 29, 30}
    states = set(zip(told["name"], told["rank"], told["step"], strict=True))
    assert {("progress.paused", 0, 9), ("progress.waiting", 1, 9)} <= states
    assert {("progress.waiting", 0, 19), ("progress.waiting", 1, 19)} <= states
    assert {("progress.paused", 0, 29), ("progress.paused", 1, 29)} <= states


def test_a_healthy_job_across_hosts_draws_no_hang_and_no_progress_report(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, "30", script=WORKLOAD, controller=("--remediate",))
    try:
        assert cluster.ended()["phase"] == "succeeded"
        assert cluster.controller.wait(timeout=30) == 0
    finally:
        cluster.close()
    cluster.no_rank_left()
    with RunReader(tmp_path / "runs" / "r") as run:
        findings = run.query("SELECT kind FROM findings WHERE kind = 'hang'")
        told = run.query("SELECT name FROM samples WHERE name LIKE 'progress.%'")
        steps = run.query("SELECT max(step) AS s FROM samples WHERE rank IS NULL")
    assert findings.empty
    assert int(steps["s"].iloc[0]) >= 20  # the steps were reduced and judged
    assert told.empty  # nothing per step from the hosts while the job steps
