"""The ranks' telemetry in `eagleeye controller` + `eagleeye agent` (loopback): each
agent keeps its ranks' raw series on its host and sends the controller one summary per
step; a rank slow against its host's others and a rank whose loss goes NaN reach the
controller's detectors as the ranks that stand out, and are findings on the right rank
and host; the controller stores their rows and the job's, not every rank's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagleeye.store import RunReader
from tests.eagleeye.test_cluster_cli import Cluster

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(200)]

HOOKED = """
import math, os, sys, time
import eagleeye
ee = eagleeye.init()
rank = int(os.environ["RANK"])
PERIOD = 0.3  # ranks in lockstep, as a collective keeps them: every step ends on the clock
for i in range(int(float(sys.argv[1]))):
    slot = int(time.time() / PERIOD) + 1
    ee.step_start(slot)
    time.sleep(0.15 if rank == 1 and i >= 5 else 0.02)  # rank 1 computes slowly
    with ee.collective("all_reduce"):  # and the others wait for it here
        time.sleep(max(slot * PERIOD - time.time(), 0.0))
    ee.step_end(slot, loss=math.nan if rank == 6 and i == 20 else 1.0)
ee.close()
"""


def test_slow_and_nan_ranks_are_found_from_host_summaries(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, "30", nproc=4, script=HOOKED)
    try:
        end, findings = cluster.findings_to_the_end()
        assert end["phase"] == "succeeded"
        assert [a.wait(timeout=30) for a in cluster.agents] == [0, 0]
    finally:
        cluster.close()
    named = {(f["kind"], f["subject"]["rank"], f["subject"]["node"]) for f in findings}
    assert ("slow_rank", 1, "node0") in named
    assert ("nan", 6, "node1") in named
    assert {kind for kind, _, _ in named} <= {"slow_rank", "nan"}, named
    with RunReader(tmp_path / "runs" / "r") as run:
        rows = run.query("SELECT DISTINCT rank FROM samples WHERE name = 'compute_ms'")
        job = run.query("SELECT COUNT(*) AS n FROM samples WHERE name = 'step_time.max'")
    assert 1 in set(rows["rank"])
    assert len(set(rows["rank"])) < 8  # the ranks that stood out, not every rank
    assert job["n"][0] >= 20  # the job's frame of (nearly) every step
    raw = (tmp_path / "logs1" / "telemetry.jsonl").read_text().splitlines()
    ranks = {json.loads(line)["labels"]["rank"] for line in raw}
    assert ranks == {"4", "5", "6", "7"}  # every rank of the host, kept on the host
    cluster.no_rank_left()
