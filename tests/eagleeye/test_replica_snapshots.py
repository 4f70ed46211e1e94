"""Replica recovery through the snapshot holders (`eagleeye run --recovery replica
--snapshots`): the saving replica's ranks each hold a share in their node's holder, every
rank of a restarted job restores from the fastest tier, and flags that cannot work are
refused before anything starts."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from eagleeye.snapshots import Holders
from eagleeye.store import RunReader
from ft_runtime.layout import JobLayout
from ft_runtime.replica import Snapshots
from tests.eagleeye.replica_helpers import events, final_params_identical, run_replicas, steps_table

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@dataclass(frozen=True)
class Placed:
    replica_rank: int
    replica_size: int


def _env(holders: Holders, node: str) -> dict[str, str]:
    return {**holders.env, "EAGLEEYE_NODE": node}


def test_the_saving_replicas_shares_restore_whole_on_every_node(tmp_path) -> None:
    """Replica 0 (node0, two ranks) saves; a rank of replica 1 (node1) restores the whole
    state, and a rollback's bound picks the older snapshot."""
    layout = JobLayout(nnodes=2, nproc_per_node=2, replicas=2)
    state = {"model": {"w": torch.randn(1001), "b": torch.arange(7)}, "manager": {"step": 4}}
    newer = {**state, "manager": {"step": 8}}
    with Holders(layout, "t-replica-snap", tmp_path / "snapshots") as holders:
        savers = [Snapshots.from_env(Placed(r, 2), _env(holders, "node0")) for r in range(2)]
        for saver in savers:
            assert saver is not None
            assert saver.save(state, 3).ok
            assert saver.save(newer, 7).ok
            saver.close()
        reader = Snapshots.from_env(Placed(0, 2), _env(holders, "node0"))
        assert reader is not None
        got = reader.load()
        older = reader.load(at_most=6)
        none = reader.load(at_most=2)
        reader.close()
        elsewhere = Snapshots.from_env(Placed(1, 2), _env(holders, "node1"))
        assert elsewhere is not None
        far = elsewhere.load()
        elsewhere.close()
    assert got is not None
    assert older is not None
    assert far is not None
    assert (got.step, got.tier) == (7, "memory")
    assert got.state["manager"] == {"step": 8}
    assert torch.equal(got.state["model"]["w"], state["model"]["w"])
    assert torch.equal(got.state["model"]["b"], state["model"]["b"])
    assert (older.step, older.state["manager"]) == (3, {"step": 4})
    assert none is None
    assert far.step == 7
    assert far.tier in ("memory", "peer")
    assert torch.equal(far.state["model"]["w"], state["model"]["w"])


def test_without_holders_there_are_no_snapshots() -> None:
    assert Snapshots.from_env(Placed(0, 1), {}) is None


def eagleeye(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "eagleeye", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--recovery", "replica", "--replicas", "2", "--nproc-per-node", "2",
             str(EXAMPLES / "ddp_train_replica.py")],
            "--snapshots with --recovery replica: ",
        ),
        (["x.py"], "--snapshots: x.py saves its checkpoints itself"),
        (["--resume", "runs/r1"], "--snapshots cannot change a resumed run"),
    ],
)  # fmt: skip
def test_snapshots_a_script_cannot_use_are_refused_in_one_line(tmp_path, args, message) -> None:
    (tmp_path / "x.py").write_text("import torch\ntorch.save({}, 'c.pt')\n")
    result = eagleeye("run", "--snapshots", *args, cwd=tmp_path)
    assert result.returncode == 2
    assert message in result.stderr
    assert "drop --snapshots" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(400)
def test_a_wipe_out_restarts_the_job_from_the_holders_memory(tmp_path) -> None:
    """2 replicas of 2 ranks on 2 nodes, a rank of each killed at step 30: the job restarts
    and every rank restores step 19 from its node's holder (node1 from its backup of
    node0's snapshot); the replicas end bitwise identical, each batch trained once since."""
    steps = 60
    result = run_replicas(
        tmp_path,
        "snap",
        steps,
        ("kill:rank=1@step=30", "kill:rank=2@step=30"),
        JobLayout(2, 2, 2),
        min_replicas=2,
        snapshots=True,
    )
    assert result.succeeded
    job = events(result.run_dir)
    recovering = job[(job["subject"] == "job") & (job["phase"] == "recovering")]
    assert len(recovering) == 1
    assert recovering["detail"].iloc[0]["reason"].startswith("wipe-out")
    with RunReader(result.run_dir) as reader:
        table = reader.checkpoints()
    saved = table[table["state"] == "CACHED"]
    assert set(saved["tier"]) == {"memory"}
    assert set(saved["rank"]) <= {0, 1}  # replica 0, the source, saves for all
    restores = table[table["state"] == "RESTORED"]
    assert sorted(restores["rank"]) == [0, 1, 2, 3]
    assert set(restores["tier"]) == {"memory"}
    assert set(restores["step"]) == {19}  # --checkpoint-every 20; the faults came at 30
    steps_seen = steps_table(result.run_dir)
    for rank in range(4):
        own = steps_seen[(steps_seen["name"] == "step_time") & (steps_seen["rank"] == rank)]
        last = own[own["attempt"] == own["attempt"].max()]
        assert sorted(last["step"]) == list(range(20, steps))
        batches = steps_seen[(steps_seen["name"] == "batch") & (steps_seen["rank"] == rank)]
        final = batches[batches["attempt"] == batches["attempt"].max()]
        kept = batches[(batches["attempt"] < batches["attempt"].max()) & (batches["step"] <= 19)]
        trained = sorted([*kept["value"], *final["value"]])
        assert trained == list(range(len(trained)))  # each batch once since the snapshot
    assert final_params_identical(tmp_path / "snap" / "params") == (4, True)
