"""`eagleeye demo` and `eagleeye run` by default: the ranks started by an `eagleeye agent`
per virtual node on this machine (the cluster path), the fault still detected and
remediated, every finding on its host, and nothing left behind, not even when
`eagleeye run` is SIGKILLed; `--no-local-agents` starts no agent."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eagleeye.agents.local import SECRET_FILE
from eagleeye.store import RunReader
from eagleeye.summary import summarize
from tests.eagleeye.conftest import DemoRun
from tests.eagleeye.procs import is_rank, left_naming, naming, parent
from tests.workload_args import tiny_workload

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(420)]


def test_the_demo_runs_through_local_agents(demo_run: DemoRun) -> None:
    # `eagleeye demo --steps 90 --kill-step 10`, run once for the tests that read it, with
    # the parent of every rank process seen while it ran (tests/eagleeye/conftest.py)
    output, parents = demo_run.output, demo_run.parents
    assert demo_run.returncode == 0, output[-3000:]
    run = demo_run.faulted
    reader = RunReader(run)
    events = reader.events()
    # one agent per virtual node, each a child of the demo
    agents = events[events["subject"].str.startswith("agent:") & (events["phase"] == "running")]
    agent_pids = {int(d["pid"]) for d in agents["detail"]}
    assert len(agent_pids) == 2
    # every rank the run launched was started by an agent, none by the demo itself
    launched = events[events["subject"].str.startswith("rank:") & (events["phase"] == "running")]
    rank_pids = {int(d["pid"]) for d in launched["detail"]}
    assert len(rank_pids) >= 6  # 4 ranks, then the killed rank's replica restarted
    assert {d["agent"] for d in launched["detail"]} == {
        f"{socket.gethostname()}-{n}" for n in (0, 1)
    }
    seen = rank_pids & set(parents)
    assert seen, "no rank process of the run was seen while it ran"
    assert {parents[pid] for pid in seen} <= agent_pids
    assert demo_run.pid not in {parents[pid] for pid in seen}
    # the kill was detected and remediated; the job succeeded
    assert reader.faults().iloc[0]["spec"] == "kill:rank=3@step=10"
    finding = reader.findings().iloc[0]
    assert (finding["kind"], finding["rank"]) == ("process_exit", 3)
    action = reader.actions().iloc[0]
    assert (action["kind"], action["target"], action["status"]) == ("restart", "replica:1", "done")
    assert reader.meta()["result"]["succeeded"] is True
    assert reader.meta()["config"]["local_agents"] is True
    # the summary names the host of every finding
    summary = summarize(str(run))
    ids = list(summary.findings["id"])
    assert ids
    assert {summary.host_of(i) for i in ids} == {socket.gethostname()}
    assert f"│ process_exit │ rank 3 │ {socket.gethostname()} │" in output
    # nothing left (waited for up to 20 s once the demo ended): no agent, no rank, no secret
    assert demo_run.left == {}
    assert not (run / SECRET_FILE).exists()


def test_a_job_restart_through_local_agents(tmp_path: Path) -> None:
    """The synchronous baseline: a killed rank restarts every rank, through the agents."""
    result = subprocess.run(
        [
            sys.executable, "-m", "eagleeye", "run", "--remediate",
            "--inject", "kill:rank=1@step=8", "--nnodes", "2", "--nproc-per-node", "1",
            "--runs-dir", str(tmp_path), "-m", "eagleeye.workload.train", "--",
            *tiny_workload(20, 5),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    (run,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    reader = RunReader(run)
    finding = reader.findings().iloc[0]
    assert (finding["kind"], finding["rank"]) == ("process_exit", 1)
    action = reader.actions().iloc[0]
    assert (action["kind"], action["target"], action["status"]) == ("restart", "job", "done")
    events = reader.events()
    launched = events[events["subject"].str.startswith("rank:") & (events["phase"] == "running")]
    assert sorted(launched["attempt"]) == [0, 0, 1, 1]  # both attempts through the agents
    host = socket.gethostname()
    assert {d["agent"] for d in launched["detail"]} == {f"{host}-0", f"{host}-1"}
    assert re.search(rf"process_exit on rank 1 at step \d+, host {re.escape(host)}", output)
    _assert_nothing_left(tmp_path)


def test_a_sigkilled_run_leaves_no_agent_and_no_rank(tmp_path: Path) -> None:
    run = _long_run(tmp_path)
    try:
        ranks = _wait_for_ranks(run, tmp_path)
        agents = {p for p, c in naming(tmp_path).items() if c.split()[1:4] == AGENT}
        assert len(agents) == 2
        assert set(ranks.values()) <= agents  # each rank is its agent's child
        run.send_signal(signal.SIGKILL)
        run.wait()
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    _assert_nothing_left(tmp_path)


def test_a_local_agent_killed_mid_run_is_started_again_and_the_job_restarts(
    tmp_path: Path,
) -> None:
    run = subprocess.Popen(
        [
            sys.executable, "-m", "eagleeye", "run", "--remediate",
            "--nnodes", "2", "--nproc-per-node", "1", "--runs-dir", str(tmp_path),
            "-m", "eagleeye.workload.train", "--", *tiny_workload(300, 50),
            "--step-floor-s", "0.05",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        agent = None
        while agent is None and time.monotonic() < deadline and run.poll() is None:
            procs = naming(tmp_path)
            if sum(is_rank(c) for c in procs.values()) == 2:
                agent = next(p for p, c in procs.items() if _is_agent_of(c, node=1))
            time.sleep(0.1)
        assert agent is not None, "the run's two ranks never started"
        time.sleep(2.0)  # training
        os.kill(agent, signal.SIGKILL)  # as the OOM killer would
        output = run.communicate(timeout=240)[0]
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == 0, output[-3000:]
    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    with RunReader(folder) as reader:
        events = reader.events()
        finding = reader.findings().iloc[0]
        action = reader.actions().iloc[0]
    name = f"{socket.gethostname()}-1"
    mine = events[events["subject"] == f"agent:{name}"]
    assert list(mine["phase"]) == ["running", "exited", "running"]  # joined, lost, again
    joined = [int(d["pid"]) for d in mine[mine["phase"] == "running"]["detail"]]
    assert joined[0] == agent
    assert joined[1] != agent
    assert (finding["kind"], finding["rank"]) == ("process_exit", 1)
    assert (action["kind"], action["target"], action["status"]) == ("restart", "job", "done")
    launched = events[events["subject"].str.startswith("rank:") & (events["phase"] == "running")]
    again = launched[launched["attempt"] == 1]
    assert {d["agent"] for d in again["detail"]} == {f"{socket.gethostname()}-0", name}
    _assert_nothing_left(tmp_path)


def test_no_local_agents_runs_the_ranks_as_its_own_children(tmp_path: Path) -> None:
    run = _long_run(tmp_path, "--no-local-agents")
    try:
        ranks = _wait_for_ranks(run, tmp_path)
        assert set(ranks.values()) == {run.pid}
        assert not [c for c in naming(tmp_path).values() if c.split()[1:4] == AGENT]
        run.send_signal(signal.SIGTERM)
        assert run.wait(60) != 0  # stopped before its end
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    _assert_nothing_left(tmp_path)
    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    with RunReader(folder) as reader:
        assert reader.meta()["config"]["local_agents"] is False
        assert not reader.events()["subject"].str.startswith("agent:").any()


AGENT = ["-m", "eagleeye", "agent"]


def _long_run(tmp_path: Path, *flags: str) -> subprocess.Popen[bytes]:
    """`eagleeye run` of two one-rank nodes training far longer than any test waits."""
    return subprocess.Popen(
        [
            sys.executable, "-m", "eagleeye", "run", *flags,
            "--nnodes", "2", "--nproc-per-node", "1", "--runs-dir", str(tmp_path),
            "-m", "eagleeye.workload.train", "--", *tiny_workload(2000, 50),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip


def _wait_for_ranks(run: subprocess.Popen[bytes], tmp_path: Path) -> dict[int, int]:
    """The run's two rank processes, each with its parent, once both started."""
    deadline = time.monotonic() + 180
    ranks: dict[int, int] = {}
    while len(ranks) < 2 and time.monotonic() < deadline and run.poll() is None:
        ranks = {p: parent(p) for p, c in naming(tmp_path).items() if is_rank(c)}
        time.sleep(0.1)
    assert len(ranks) == 2, "the run's two ranks never started"
    return ranks


def _is_agent_of(cmdline: str, node: int) -> bool:
    words = cmdline.split()
    return words[1:4] == AGENT and words[words.index("--node-rank") + 1] == str(node)


def _assert_nothing_left(tmp_path: Path) -> None:
    """No process that names the test's folder (agents, ranks) remains (waited for a while:
    a killed process's children get their signal asynchronously)."""
    assert left_naming(tmp_path) == {}
