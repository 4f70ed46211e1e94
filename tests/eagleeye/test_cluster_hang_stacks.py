"""A hang's stacks across hosts (loopback, two agents, real ranks): before the
controller's restart, each host's agent reads its ranks' stacks and they are stored with
the finding, each naming its host. A rank asleep before its all-reduce (rank 3, host B)
shows the line it sleeps on, the three ranks waiting for it (both hosts) the all-reduce.
An agent that does not answer (host A's, stopped) costs the wait, not the restart: its
rank is recorded without stacks and why, the job restarts and succeeds once the agent is
continued."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

import pytest

from eagleeye.store import RunReader
from tests.eagleeye.test_cluster_cli import Cluster
from tests.eagleeye.test_cluster_collective_hang import TAIL
from tests.eagleeye.test_cluster_hang import LOOP_HEAD, SYNCHRONOUS, _until_step

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(240)]

#: rank 3 sleeps before its all-reduce at step 12 of the first attempt; the others wait
ASLEEP = (
    "import os\n"
    + LOOP_HEAD
    + """    if i == 12 and ee.rank == 3 and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
        time.sleep(100)  # asleep before the all-reduce
"""
    + TAIL
)
SLEEP_LINE = (
    ASLEEP.splitlines().index("        time.sleep(100)  # asleep before the all-reduce") + 1
)
HOST_B = ("--hostname", "host-b")  # node rank 1's agent names its host so


def _hang_stacks(run: Path) -> tuple[int, dict[int, dict]]:
    """The one hang finding's id and its stacks by rank."""
    with RunReader(run) as reader:
        (hang,) = reader.query("SELECT id FROM findings WHERE kind = 'hang'")["id"]
        rows = reader.stacks(int(hang))
    return int(hang), {int(r["rank"]): dict(r) for _, r in rows.iterrows()}


def test_a_hang_across_hosts_stores_every_ranks_stack_with_its_host(tmp_path: Path) -> None:
    cluster = Cluster(
        tmp_path,
        "30",
        extra=HOST_B,
        nproc=2,
        script=ASLEEP,
        # a long wait: every host answers, however loaded the machine (the capture may
        # take 0.6 of it)
        controller=("--remediate", "--hang-idle-s", "3", "--stacks-wait", "15"),
    )
    try:
        cluster.launched({0, 1, 2, 3}, 0)
        finding = cluster.read(lambda i: i.get("type") == "Finding")
        assert (finding["kind"], finding["subject"]["rank"]) == ("hang", 3)
        shown = cluster.read(lambda i: i.get("type") == "HangStacks")
        assert sorted(s["rank"] for s in shown["stacks"]) == [0, 1, 2, 3]
        cluster.launched({0, 1, 2, 3}, 1)
        assert cluster.ended()["phase"] == "succeeded"
        assert cluster.controller.wait(timeout=30) == 0
    finally:
        cluster.close()
    cluster.no_rank_left()
    hang, stacks = _hang_stacks(tmp_path / "runs" / "r")
    assert sorted(stacks) == [0, 1, 2, 3]
    here = socket.gethostname()
    assert [stacks[r]["host"] for r in range(4)] == [here, here, "host-b", "host-b"]
    # read from the ranks of the attempt that hung, before the restart ended them
    assert {r: stacks[r]["pid"] for r in range(4)} == {r: cluster.by_rank[(0, r)] for r in range(4)}
    assert {stacks[r]["attempt"] for r in range(4)} == {0}
    assert all(stacks[r]["method"] in ("py-spy", "faulthandler") for r in range(4))
    culprit = stacks[3]["text"]
    assert f"rank.py:{SLEEP_LINE}" in culprit or f'rank.py", line {SLEEP_LINE}' in culprit
    for waiting in (0, 1, 2):
        assert "all_reduce" in stacks[waiting]["text"]
    with RunReader(tmp_path / "runs" / "r") as run:
        actions = run.query("SELECT kind, status, finding_id FROM actions")
    assert list(actions.itertuples(index=False, name=None)) == [("restart", "done", hang)]


def test_an_agent_that_does_not_answer_costs_the_wait_not_the_restart(tmp_path: Path) -> None:
    # a long heartbeat: host A's agent, stopped, is not lost while the test holds it
    controller = ("--remediate", "--heartbeat", "20")
    cluster = Cluster(tmp_path, "120", extra=HOST_B, script=SYNCHRONOUS, controller=controller)
    agent_a = cluster.agents[0]
    try:
        cluster.launched({0, 1}, 0)
        _until_step(tmp_path / "runs" / "r", 20)
        os.kill(agent_a.pid, signal.SIGSTOP)
        os.kill(cluster.by_rank[(0, 1)], signal.SIGSTOP)  # rank 1, on host B: the hang
        finding = cluster.read(lambda i: i.get("type") == "Finding")
        assert (finding["kind"], finding["subject"]["rank"]) == ("hang", 1)
        decision = cluster.read(lambda i: i.get("type") == "Decision")
        assert decision["outcome"]["action"]["kind"] == "restart"
        os.kill(agent_a.pid, signal.SIGCONT)  # it reads its stacks late, then restarts
        cluster.launched({0, 1}, 1)
        assert cluster.ended()["phase"] == "succeeded"
        assert cluster.controller.wait(timeout=30) == 0
    finally:
        if agent_a.poll() is None:
            os.kill(agent_a.pid, signal.SIGCONT)
        cluster.close()
    cluster.no_rank_left()
    hang, stacks = _hang_stacks(tmp_path / "runs" / "r")
    assert sorted(stacks) == [0, 1]
    here = socket.gethostname()
    assert (stacks[0]["host"], stacks[0]["method"]) == (here, "none")
    assert "did not answer within 5 s" in stacks[0]["text"]
    # host B's agent read its stopped rank (py-spy reads a stopped process; without it,
    # the rank is reported stopped and without a stack)
    assert (stacks[1]["host"], stacks[1]["state"]) == ("host-b", "T")
    assert stacks[1]["pid"] == cluster.by_rank[(0, 1)]
    with RunReader(tmp_path / "runs" / "r") as run:
        actions = run.query("SELECT kind, status, finding_id FROM actions")
    assert list(actions.itertuples(index=False, name=None)) == [("restart", "done", hang)]
