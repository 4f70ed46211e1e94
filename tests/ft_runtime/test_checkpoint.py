from __future__ import annotations

import os
import pickle

import pytest
import torch

from ft_runtime.checkpoint import DiskCheckpointer
from ft_runtime.errors import CheckpointError, CheckpointsUnusable


def state(seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    return {
        "model": {"w": torch.randn(64, 64, generator=gen)},
        "data": {"position": seed},
        "rng": torch.get_rng_state(),
    }


def test_load_returns_the_newest_complete_checkpoint_bit_for_bit(tmp_path) -> None:
    ckpt = DiskCheckpointer(tmp_path, keep=3)
    ckpt.save(state(1), step=10)
    ckpt.save(state(2), step=20)
    step, loaded = ckpt.load()
    assert step == 20
    assert torch.equal(loaded["model"]["w"], state(2)["model"]["w"])
    assert loaded["data"] == {"position": 2}


def test_a_flipped_bit_or_truncation_falls_back_to_the_previous_checkpoint(tmp_path) -> None:
    ckpt = DiskCheckpointer(tmp_path, keep=3)
    for step in (10, 20, 30):
        ckpt.save(state(step), step=step)
    newest = tmp_path / "step-00000030" / "rank-00000.pt"
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0x01
    newest.write_bytes(bytes(data))
    middle = tmp_path / "step-00000020" / "rank-00000.pt"
    middle.write_bytes(middle.read_bytes()[:-100])
    step, loaded = ckpt.load()
    assert step == 10
    assert loaded["data"] == {"position": 10}


def test_a_checkpoint_without_manifest_does_not_count(tmp_path) -> None:
    writer = DiskCheckpointer(tmp_path, rank=0, world_size=2, barrier=lambda: None)
    other = DiskCheckpointer(tmp_path, rank=1, world_size=2)
    writer.save(state(1), step=10)
    other.save(state(2), step=10)  # rank 1 never writes the manifest
    (tmp_path / "step-00000020").mkdir()
    (tmp_path / "step-00000020" / "rank-00001.pt").write_bytes(b"partial")
    assert DiskCheckpointer(tmp_path, rank=1, world_size=2).load()[0] == 10


def test_checkpoints_of_another_world_size_are_refused(tmp_path) -> None:
    DiskCheckpointer(tmp_path, world_size=1).save(state(1), step=10)
    with pytest.raises(CheckpointsUnusable, match="saved by 1 ranks"):
        DiskCheckpointer(tmp_path, world_size=4).load()


def test_loading_never_unpickles_arbitrary_objects(tmp_path) -> None:
    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned > evil",))

    ckpt = DiskCheckpointer(tmp_path)
    ckpt.save(state(1), step=10)
    ckpt.save(state(2), step=20)
    target = tmp_path / "step-00000020" / "rank-00000.pt"
    payload = pickle.dumps({"model": Evil()})
    torch.save({"model": Evil()}, target)  # a forged file with a valid-looking name
    import hashlib
    import json

    meta = target.with_suffix(".json")
    body = target.read_bytes()
    meta.write_text(json.dumps({"bytes": len(body), "sha256": hashlib.sha256(body).hexdigest()}))
    assert payload  # the forged object does pickle
    step, _ = ckpt.load()
    assert step == 10, "the forged checkpoint must be refused, not executed"
    assert not (tmp_path / "evil").exists()
    assert not os.path.exists("evil")


def test_retention_keeps_the_last_k(tmp_path) -> None:
    ckpt = DiskCheckpointer(tmp_path, keep=2)
    for step in (1, 2, 3, 4):
        ckpt.save(state(step), step=step)
    assert ckpt.complete_steps() == [4, 3]


def test_an_unwritable_directory_is_a_checkpoint_error(tmp_path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(CheckpointError, match="cannot write checkpoint of step 5"):
        DiskCheckpointer(blocker / "ckpt").save(state(1), step=5)
