"""The ranks' telemetry under `eagleeye controller --recovery replica` (loopback): two
replicas, one per agent, each rank reporting its steps through the in-loop hook. The
hosts' summaries reach the controller's detectors as in job recovery: a rank whose loss
goes non-finite (a fault injected through its agent's environment) is one `nan` finding
on that rank and its node, answered by the built-in policy (a notice), and the
exporter serves the job's steps; a healthy job across hosts finds nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from eagleeye.store import RunReader
from ft_runtime.ports import free_port
from tests.eagleeye.cluster_replica_helpers import steps
from tests.eagleeye.test_cluster_replicas import Job, wait_for
from tests.eagleeye.test_host_sources_live import scrape, until
from tests.eagleeye.test_webhook_live import step

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(300)]

HOOKED = """
import math, os, sys, time
import torch
import eagleeye
from ft_runtime import replica

torch.set_num_threads(1)
torch.manual_seed(0)
ee = eagleeye.init()
nan_at = int(os.environ.get("TEST_NAN_AT_STEP", "-1"))  # the injected fault, if any
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)


def state_dict():
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}


def load(state):
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])


manager = replica.Manager(state_dict, load)
optimizer = replica.OptimizerWrapper(manager, optimizer)
x = torch.ones(8, 4)
while True:
    at = manager.current_step()
    ee.step_start(at)
    optimizer.zero_grad()
    loss = model(x).sum()
    loss.backward()
    time.sleep(0.05)
    optimizer.step()
    ee.step_end(at, loss=math.nan if at == nan_at else float(loss))
    step = manager.current_step()
    print(f"step {step}", flush=True)
    try:
        end = int(open(sys.argv[1]).read())
    except (OSError, ValueError):
        end = None
    if end is not None and step >= end:
        break
manager.close()
ee.close()
"""


def hooked(tmp_path: Path, controller: tuple[str, ...] = ()) -> Job:
    job = Job(tmp_path, ("--remediate", *controller))
    job.script.write_text(HOOKED)
    return job


def test_a_non_finite_loss_on_one_replica_is_one_finding_on_its_rank_and_host(
    tmp_path: Path,
) -> None:
    metrics = free_port()
    job = hooked(tmp_path, ("--metrics-port", str(metrics)))
    job.agent_env["logs1"] = {"TEST_NAN_AT_STEP": "15"}  # node rank 1's rank only
    try:
        job.start(spare=False, host_b=("--hostname", "host-b"))
        finding = job.lines.next(lambda i: i.get("type") == "Finding")
        assert (finding["kind"], finding["subject"]["rank"]) == ("nan", 1), finding
        assert finding["subject"]["node"] == "node1"
        until("the job's steps", lambda: step(scrape(metrics)) >= 10)
        wait_for(lambda: steps(job.healthy)[-1] > 25, "replica 0 stopped stepping")
        job.finished()
        assert [proc.wait(timeout=60) for proc in job.agents] == [0, 0]
    finally:
        job.close()
    hosts = {
        i["detail"]["node"]: i["detail"]["host"]
        for i in job.lines.seen
        if str(i.get("subject", "")).startswith("agent:") and "node" in i.get("detail", {})
    }
    assert hosts[1] == "host-b"  # the finding's node1: the host of node rank 1's agent
    with RunReader(tmp_path / "runs" / "r") as run:
        findings, actions = run.findings(), run.actions()
        job_steps = run.query("SELECT COUNT(*) AS n FROM samples WHERE name = 'step_time.max'")
    assert list(zip(findings["kind"], findings["rank"], findings["node"], strict=True)) == [
        ("nan", 1, "node1")
    ]
    answered = zip(actions["finding_kind"], actions["kind"], actions["status"], strict=True)
    assert list(answered) == [("nan", "notify", "done")]  # the built-in policy: a notice
    assert job_steps["n"][0] >= 20  # the job's frame of (nearly) every step, stored
    job.no_rank_left(job.first[0]["pid"], job.first[1]["pid"])


def test_a_healthy_replica_job_across_hosts_finds_nothing(tmp_path: Path) -> None:
    job = hooked(tmp_path)
    try:
        job.start(spare=False)
        wait_for(lambda: steps(job.healthy)[-1] > 25, "replica 0 stopped stepping")
        job.finished()
        assert [proc.wait(timeout=60) for proc in job.agents] == [0, 0]
    finally:
        job.close()
    assert [i for i in job.lines.seen if i.get("type") == "Finding"] == []
    with RunReader(tmp_path / "runs" / "r") as run:
        assert run.findings().empty
        assert run.actions().empty
        job_steps = run.query("SELECT COUNT(*) AS n FROM samples WHERE name = 'step_time.max'")
    assert job_steps["n"][0] >= 20  # the telemetry was there to judge
    job.no_rank_left(job.first[0]["pid"], job.first[1]["pid"])
