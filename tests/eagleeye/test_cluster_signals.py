"""SIGTERM to `eagleeye controller` or to an `eagleeye agent` mid-run (loopback, a 2-host
gloo job whose loop saves when asked, ``ee.checkpoint_requested()``): with a grace period
every rank checkpoints at the same step first, the store records the checkpoints and the
stop with its cause, and every rank ends; no rank outlives the run."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from eagleeye.store import RunReader
from tests.eagleeye.test_cluster_cli import Cluster

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(300)]

LOOP = (Path(__file__).parents[1] / "fixtures" / "scripts" / "hooked_loop.py").read_text()
GRACE = ("--grace-period", "40")
# listens before its first step, then waits: a stop comes before any step is known
LISTENS_FIRST = LOOP.replace("import os\n", "import os\nimport time\n").replace(
    "    step = 0\n",
    "    ee.checkpoint_requested()\n    time.sleep(2.0)\n    step = 0\n",
)


def listening(cluster: Cluster) -> None:
    """Reads until both ranks' loops listen for a checkpoint request."""
    seen: set[str] = set()
    while seen != {"rank:0", "rank:1"}:
        item = cluster.read(lambda i: bool(i.get("detail", {}).get("listening")))
        seen.add(str(item["subject"]))


def stopped_by_the_controllers_sigterm(cluster: Cluster) -> None:
    """The job ended on the controller's SIGTERM: the controller left with 1, each agent
    with 0 (told to stop)."""
    end = cluster.ended()
    assert (end["phase"], end["detail"]["reason"]) == ("failed", "stopped by SIGTERM")
    assert cluster.controller.wait(timeout=60) == 1
    assert [a.wait(timeout=60) for a in cluster.agents] == [0, 0]


def stopped_after_checkpoints(tmp: Path, cause: str) -> None:
    with RunReader(tmp / "runs" / "r") as run:
        saved = run.query("SELECT rank, step, time FROM checkpoints ORDER BY rank")
        end = run.query(
            "SELECT time, detail FROM events WHERE subject = 'job' AND phase = 'failed'"
        )
    assert list(saved["rank"]) == [0, 1]
    assert len(set(saved["step"])) == 1  # both left their loop at the same step
    assert cause in end["detail"][0]
    assert max(saved["time"]) <= end["time"][0]  # the checkpoints landed first
    steps = {
        line.split()[-1]
        for n in (0, 1)
        for line in (tmp / f"logs{n}" / "attempt-0" / f"rank-{n}.log").read_text().splitlines()
        if line.startswith("saved on request")
    }
    assert steps == {str(saved["step"][0])}


def test_sigterm_to_the_controller_checkpoints_then_stops_every_rank(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, "0", script=LOOP, controller=GRACE)
    try:
        listening(cluster)
        cluster.controller.send_signal(signal.SIGTERM)
        stopped_by_the_controllers_sigterm(cluster)
    finally:
        cluster.close()
    stopped_after_checkpoints(tmp_path, "stopped by SIGTERM")
    cluster.no_rank_left()


def test_sigterm_to_an_agent_checkpoints_every_host_then_stops(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, "0", extra=GRACE, script=LOOP, controller=GRACE)
    try:
        listening(cluster)
        cluster.agents[1].send_signal(signal.SIGTERM)
        end = cluster.ended()
        assert end["phase"] == "failed"
        assert end["detail"]["reason"].startswith("stopped by SIGTERM to the agent")
        assert cluster.controller.wait(timeout=60) == 1
        assert [a.wait(timeout=60) for a in cluster.agents] == [0, 0]
    finally:
        cluster.close()
    stopped_after_checkpoints(tmp_path, "SIGTERM to the agent")
    cluster.no_rank_left()


def test_a_stop_before_any_step_is_known_names_one_step_to_every_rank(tmp_path: Path) -> None:
    """Asked "at once" (no step known yet), each rank read the request at a step of its
    own and the two waited on each other's collectives to the end of the grace period,
    saving nothing: the controller waits for a step first, then names one."""
    assert "time.sleep(2.0)" in LISTENS_FIRST
    cluster = Cluster(tmp_path, "0", script=LISTENS_FIRST, controller=GRACE)
    try:
        listening(cluster)
        cluster.controller.send_signal(signal.SIGTERM)  # the ranks have not stepped yet
        asked = cluster.read(lambda i: "checkpoint_requested" in i.get("detail", {}))
        assert isinstance(asked["detail"]["checkpoint_requested"], int)
        stopped_by_the_controllers_sigterm(cluster)
    finally:
        cluster.close()
    stopped_after_checkpoints(tmp_path, "stopped by SIGTERM")
    cluster.no_rank_left()
