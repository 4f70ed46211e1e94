"""Precise comparisons across hosts (`eagleeye controller` + `eagleeye agent` on
loopback). A rank 10 % slower than the others of its host never stands out in the host
summary (its bar is 20 %), but the agent's precise peer comparison of its ranks finds it;
a node whose every rank is 10 % slower is found by the controller's comparison of the
hosts' medians. Each is one finding on the right rank or node; nothing else is named."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.eagleeye.test_cluster_cli import Cluster

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(200)]

# Ranks in lockstep, as a collective keeps them: every step ends on the clock. Each rank
# computes 200 ms (a sleep: its jitter on a loaded 2-core host stays a few per cent of it);
# the ranks SLOW compute 220 ms from their 40th step on (they note it).
LOCKSTEP = """
import os, sys, time
import eagleeye
ee = eagleeye.init()
rank = int(os.environ["RANK"])
PERIOD = 0.4
for i in range(int(float(sys.argv[1]))):
    slot = int(time.time() / PERIOD) + 1
    ee.step_start(slot)
    slow = rank in SLOW and i >= 40
    if slow and i == 40:
        open(SLOW_FROM, "w").write(str(slot))
    time.sleep(0.22 if slow else 0.2)
    with ee.collective("all_reduce"):  # the others wait for it here
        time.sleep(max(slot * PERIOD - time.time(), 0.0))
    ee.step_end(slot, loss=1.0)
ee.close()
"""


def _findings(tmp_path: Path, slow: set[int], nnodes: int, nproc: int) -> list[dict]:
    script = LOCKSTEP.replace("SLOW_FROM", repr(str(tmp_path / "slow_from")))
    script = script.replace("SLOW", repr(slow))
    cluster = Cluster(tmp_path, "75", nproc=nproc, script=script, nnodes=nnodes)
    try:
        end, findings = cluster.findings_to_the_end()
        assert end["phase"] == "succeeded"
        assert [a.wait(timeout=30) for a in cluster.agents] == [0] * nnodes
    finally:
        cluster.close()
    cluster.no_rank_left()
    return findings


def test_a_rank_ten_per_cent_slower_is_found_on_its_host(tmp_path: Path) -> None:
    findings = _findings(tmp_path, {1}, nnodes=2, nproc=4)
    named = [(f["kind"], f["subject"]["rank"], f["subject"]["node"]) for f in findings]
    assert named == [("slow_rank", 1, "node0")], findings
    (found,) = findings
    assert found["detector"] == "host:peer_outlier/quiet"
    assert 0 <= found["step"] - int((tmp_path / "slow_from").read_text()) <= 20


def test_a_node_ten_per_cent_slower_is_found_against_the_other_hosts(tmp_path: Path) -> None:
    findings = _findings(tmp_path, {4, 5}, nnodes=4, nproc=2)  # node 2's ranks
    named = [(f["kind"], f["subject"].get("rank"), f["subject"]["node"]) for f in findings]
    assert named == [("slow_node", None, "node2")], findings
    (found,) = findings
    assert found["detector"] == "hosts:peer_outlier/quiet"
    assert 0 <= found["step"] - int((tmp_path / "slow_from").read_text()) <= 20
