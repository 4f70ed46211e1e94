"""SIGTERM to one host's `eagleeye agent` while a spare waits (loopback, the real commands,
a 2-host gloo job whose loop saves when asked and resumes from its checkpoint, the
checkpoints in one folder every host reaches): the leaving host is drained instead of
stopping the job. With a grace period every rank checkpoints at one step first; then the
spare takes node rank 1 and both hosts restart as attempt 1 from that checkpoint, and the
job succeeds; the leaving agent ends (status 0, saying it was drained); the store has the
checkpoints before the restart, their restores, and an `evict` action with the reason.
The leaving host is no suspect: `eagleeye agent --spare` started again on it (no
`--readmit`) is admitted. No rank outlives the run."""

from __future__ import annotations

import signal
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from eagleeye.store import RunReader
from tests.eagleeye.test_cluster_cli import EAGLEEYE, Cluster

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(400)]

GRACE = ("--grace-period", "40")
# attempt 0 trains until asked for a checkpoint; a later attempt resumes from the newest
# checkpoint and trains until the test's file exists (at least 5 steps)
LOOP = """
import os, sys, time
import torch
import torch.distributed as dist
import eagleeye

ee = eagleeye.init()
dist.init_process_group("gloo")
weights = torch.zeros(64)
restored = ee.load_checkpoint()
start = 0 if restored is None else restored[0] + 1
if restored is not None:
    weights = restored[1]["weights"]
first = os.environ["TORCHELASTIC_RESTART_COUNT"] == "0"
print(f"rank {os.environ['RANK']} starts at step {start}", flush=True)
deadline = time.monotonic() + 120
step = start
while time.monotonic() < deadline:
    ee.step_start(step)
    time.sleep(0.02)  # the step's compute: inside the step, so its step time is the loop's
    grad = torch.full((64,), 1.0)
    dist.all_reduce(grad)
    weights -= 1e-3 * grad
    ee.step_end(step, loss=float(weights.abs().sum()))
    if ee.checkpoint_requested():
        ee.save_checkpoint({"weights": weights}, step)
        print(f"saved on request at step {step}", flush=True)
        break
    finished = torch.tensor([float(os.path.exists(sys.argv[1]))])
    dist.all_reduce(finished, op=dist.ReduceOp.MIN)  # every rank leaves at the same step
    if not first and step >= start + 5 and finished.item() > 0:
        break
    step += 1
dist.barrier()
dist.destroy_process_group()
ee.close()
"""


def test_sigterm_to_an_agent_with_a_spare_drains_its_host_and_the_job_succeeds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EAGLEEYE_CHECKPOINT_DIR", str(tmp_path / "checkpoints"))  # shared
    finish = tmp_path / "finish"
    cluster = Cluster(
        tmp_path, str(finish), extra=GRACE, script=LOOP, controller=GRACE, agent_errors=True
    )
    common = ["--secret-file", str(tmp_path / "secret"), "--heartbeat", "0.2"]

    def agent(name: str, *flags: str) -> subprocess.Popen[bytes]:
        with (tmp_path / f"{name}.err").open("w") as errors:
            return subprocess.Popen(
                [*EAGLEEYE, "agent", "--controller", cluster.listen, "--spare", *flags, *common]
                + ["--no-host-metrics", "--log-dir", str(tmp_path / name)]
                + [str(tmp_path / "rank.py"), str(finish)],
                stderr=errors,
            )

    spares: list[subprocess.Popen[bytes]] = []
    try:
        spares.append(agent("spare", "--hostname", "spare-host", "--advertise", "127.0.0.1"))
        seen = read_all(
            cluster,
            {
                "spare": lambda i: i.get("phase") == "running" and i["detail"].get("spare"),
                "rank:0": lambda i: i.get("subject") == "rank:0" and _listening(i),
                "rank:1": lambda i: i.get("subject") == "rank:1" and _listening(i),
            },
        )
        took = str(seen["spare"]["subject"]).removeprefix("agent:")
        cluster.agents[1].send_signal(signal.SIGTERM)  # what a preemption sends one host
        recovering = cluster.read(lambda i: i.get("phase") == "recovering")
        assert (recovering["attempt"], recovering["detail"]["node"]) == (1, 1)
        assert recovering["detail"]["spare"] == took
        assert "left on SIGTERM" in recovering["detail"]["reason"]
        # the host that left comes back as a spare, without --readmit: admitted
        spares.append(agent("back"))
        back = f"agent:{socket.gethostname()}-spare"
        read_all(
            cluster,
            {
                "back": lambda i: (
                    i.get("subject") == back
                    and i.get("phase") == "running"
                    and bool(i["detail"].get("spare"))
                ),
                "attempt 1": lambda i: (
                    i.get("subject") == "rank:1"
                    and i.get("phase") == "launch"
                    and i["detail"]["attempt"] == 1
                ),
            },
        )
        finish.touch()
        end = cluster.ended()
        assert end["phase"] == "succeeded", end
        assert cluster.controller.wait(timeout=60) == 0
        assert [a.wait(timeout=60) for a in cluster.agents] == [0, 0]
        assert [s.wait(timeout=60) for s in spares] == [0, 0]
    finally:
        cluster.close()
        for proc in spares:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
    said = (tmp_path / "agent-1.err").read_text()
    assert "eagleeye agent: drained by the controller (host" in said
    assert "evicted" not in said
    saved = _saved_step(tmp_path / "logs1" / "attempt-0" / "rank-1.log")
    assert _saved_step(tmp_path / "logs0" / "attempt-0" / "rank-0.log") == saved
    resumed = f"starts at step {saved + 1}"
    assert f"rank 1 {resumed}" in (tmp_path / "spare" / "attempt-1" / "rank-1.log").read_text()
    assert f"rank 0 {resumed}" in (tmp_path / "logs0" / "attempt-1" / "rank-0.log").read_text()
    assert not (tmp_path / "logs1" / "attempt-1").exists()  # nothing on the host that left
    assert not (tmp_path / "back" / "attempt-1").exists()  # the spare that came back waited
    with RunReader(tmp_path / "runs" / "r") as run:
        actions = run.actions()
        checkpoints = run.query(
            "SELECT rank, step, time FROM checkpoints WHERE state = 'PERSISTENT' ORDER BY rank"
        )
        restored = run.query(
            "SELECT rank, step, time FROM checkpoints WHERE state = 'RESTORED' ORDER BY rank"
        )
        restart = run.query(
            "SELECT time FROM events WHERE subject = 'job' AND phase = 'recovering'"
        )
        findings = run.findings()
    assert list(actions["kind"]) == ["evict"]
    assert actions["finding_id"].isna().all()  # a signal, no finding
    assert len(findings) == 0
    assert "left on SIGTERM" in actions["reason"][0]
    assert f"node rank 1 moved to the spare {took}" in actions["detail"][0]
    assert list(checkpoints["rank"]) == [0, 1]
    assert set(checkpoints["step"]) == {saved}
    assert max(checkpoints["time"]) <= restart["time"][0]  # the checkpoint landed first
    assert list(restored["rank"]) == [0, 1]  # attempt 1 loaded it, on both hosts
    assert set(restored["step"]) == {saved}
    cluster.no_rank_left()


def read_all(cluster: Cluster, wanted: dict[str, Callable[[dict], bool]]) -> dict[str, dict]:
    """Reads the controller's lines until each of ``wanted`` matched one, in any order."""
    seen: dict[str, dict] = {}

    def match(item: dict) -> bool:
        for name, want in wanted.items():
            if name not in seen and want(item):
                seen[name] = item
        return len(seen) == len(wanted)

    cluster.read(match)
    return seen


def _listening(item: dict) -> bool:
    return bool(item.get("detail", {}).get("listening"))


def _saved_step(log: Path) -> int:
    lines = [line for line in log.read_text().splitlines() if line.startswith("saved on")]
    assert len(lines) == 1, lines
    return int(lines[0].split()[-1])
