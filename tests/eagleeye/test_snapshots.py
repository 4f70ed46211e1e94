"""A rank's session checkpoints into real snapshot holders and restores from their memory."""

from __future__ import annotations

import pytest
import torch

from eagleeye.session import RankSession
from eagleeye.snapshots import ENV_SNAPSHOT_RING, Holders, parse_ring
from ft_runtime.ckpt import ENV_SHM_DIR
from ft_runtime.layout import JobLayout


def test_a_malformed_ring_is_refused_with_the_expected_form() -> None:
    with pytest.raises(ValueError, match="node=endpoint pairs"):
        parse_ring("node0-tcp://127.0.0.1:1")


def test_without_holders_the_session_keeps_disk_checkpoints(tmp_path) -> None:
    session = RankSession({"EAGLEEYE_CHECKPOINT_DIR": str(tmp_path)})
    assert session.snapshots is None
    session.close()


def test_a_restarted_rank_restores_both_shards_of_its_node_from_memory(tmp_path) -> None:
    layout = JobLayout(nnodes=2, nproc_per_node=2, replicas=1)
    with Holders(layout, "t-snap", tmp_path / "snapshots") as holders:
        envs = [
            {**holders.env, "EAGLEEYE_NODE": "node1", "LOCAL_RANK": str(r), "RANK": str(2 + r)}
            | {"LOCAL_WORLD_SIZE": "2", "EAGLEEYE_CHECKPOINT_DIR": str(tmp_path / "disk")}
            for r in range(2)
        ]
        state = {"model": {"w": torch.randn(1001), "b": torch.arange(7)}, "data": {"pos": 3}}
        for env in envs:  # both ranks of node1 save their half
            with RankSession(env) as session:
                session.save_checkpoint(state, 5)
        with RankSession(envs[0]) as restarted:
            got = restarted.load_checkpoint()
            assert restarted.snapshots is not None
            again = restarted.snapshots.load()
    assert again is not None
    assert again.tier == "memory"  # both halves from node1's holder, none from node0's
    assert again.seconds > 0
    assert got is not None
    step, restored = got
    assert step == 5
    assert torch.equal(restored["model"]["w"], state["model"]["w"])
    assert torch.equal(restored["model"]["b"], state["model"]["b"])
    assert restored["data"] == {"pos": 3}
    assert ENV_SNAPSHOT_RING in envs[0]
    assert not (tmp_path / "disk").exists() or not any((tmp_path / "disk").iterdir())


def test_the_holders_keep_their_segments_where_ee_ckpt_shm_dir_says(tmp_path, monkeypatch) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setenv(ENV_SHM_DIR, str(shm))
    layout = JobLayout(nnodes=1, nproc_per_node=1, replicas=1)
    with Holders(layout, "t-dir", tmp_path / "snapshots") as holders:
        env = {**holders.env, "EAGLEEYE_NODE": "node0", "LOCAL_RANK": "0", "RANK": "0"}
        env |= {"LOCAL_WORLD_SIZE": "1", "EAGLEEYE_CHECKPOINT_DIR": str(tmp_path / "disk")}
        with RankSession(env) as session:
            session.save_checkpoint({"w": torch.arange(10)}, 1)
        assert list(shm.glob("eeckpt.*"))  # the snapshot's segment, not in /dev/shm
    assert not list(shm.glob("eeckpt.*"))  # deleted when the holders stop


def test_segments_a_holder_left_behind_are_removed_when_the_holders_stop(
    tmp_path, monkeypatch
) -> None:
    """A holder SIGKILLed (or killed after it did not stop in time) deletes nothing; the
    job's segments must not stay in shared memory after it (chaos seed 27)."""
    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setenv(ENV_SHM_DIR, str(shm))
    layout = JobLayout(nnodes=2, nproc_per_node=1, replicas=1)
    with Holders(layout, "t-left", tmp_path / "snapshots"):
        left = shm / "eeckpt.t-left.node1.7.0"  # what a killed holder's table held
        left.write_bytes(b"\0" * 4096)
        other = shm / "eeckpt.another-job.node1.7.0"
        other.write_bytes(b"\0" * 4096)
    assert not left.exists()
    assert other.exists()  # another job's segments are its own
