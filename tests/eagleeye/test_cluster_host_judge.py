"""The agents judge their own ranks' full series (`eagleeye controller` + `eagleeye agent`
on loopback): a rank 10 % slower than the others of its host never stands out in the host
summary (its bar is 20 %), but the agent's precise peer comparison finds it, and the
controller answers the finding on the right rank and host; no other rank is named."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.eagleeye.test_cluster_cli import Cluster

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(200)]

# Ranks in lockstep, as a collective keeps them: every step ends on the clock. Each rank
# computes 100 ms; rank 1 computes 110 ms from its 40th step on (it notes the step).
LOCKSTEP = """
import os, sys, time
import eagleeye
ee = eagleeye.init()
rank = int(os.environ["RANK"])
PERIOD = 0.3
for i in range(int(float(sys.argv[1]))):
    slot = int(time.time() / PERIOD) + 1
    ee.step_start(slot)
    slow = rank == 1 and i >= 40
    if slow and i == 40:
        open(SLOW_FROM, "w").write(str(slot))
    time.sleep(0.11 if slow else 0.1)
    with ee.collective("all_reduce"):  # the others wait for it here
        time.sleep(max(slot * PERIOD - time.time(), 0.0))
    ee.step_end(slot, loss=1.0)
ee.close()
"""


def test_a_rank_ten_per_cent_slower_is_found_on_its_host(tmp_path: Path) -> None:
    slow_from = tmp_path / "slow_from"
    script = LOCKSTEP.replace("SLOW_FROM", repr(str(slow_from)))
    cluster = Cluster(tmp_path, "75", nproc=4, script=script)
    findings = []
    try:
        end = cluster.read(
            lambda i: (
                findings.append(i) if i.get("type") == "Finding" else None,
                i.get("subject") == "job" and i.get("phase") in ("succeeded", "failed"),
            )[1]
        )
        assert end["phase"] == "succeeded"
        assert [a.wait(timeout=30) for a in cluster.agents] == [0, 0]
    finally:
        cluster.close()
    named = [(f["kind"], f["subject"]["rank"], f["subject"]["node"]) for f in findings]
    assert named == [("slow_rank", 1, "node0")], findings
    (found,) = findings
    assert found["detector"] == "host:peer_outlier/quiet"
    assert 0 <= found["step"] - int(slow_from.read_text()) <= 20  # within 20 steps
    cluster.no_rank_left()
