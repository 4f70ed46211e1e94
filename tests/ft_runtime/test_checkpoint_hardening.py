"""Checkpoints on a full disk, with damaged manifests, of another shape, or all corrupt."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch

from ft_runtime.checkpoint import MANIFEST, DiskCheckpointer
from ft_runtime.errors import CheckpointError, CheckpointsUnusable


def state(seed: int, size: int = 64) -> dict:
    gen = torch.Generator().manual_seed(seed)
    return {"model": {"w": torch.randn(size, size, generator=gen)}, "data": {"position": seed}}


@pytest.fixture
def small_disk(tmp_path):
    """A real 1 MiB tmpfs (needs the right to mount; skipped without it)."""
    where = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip("cannot mount a small tmpfs here")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=False)


def leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.rglob(".*tmp-*"))


def test_a_full_disk_leaves_no_temporary_file_and_later_small_saves_work(small_disk) -> None:
    ckpt = DiskCheckpointer(small_disk, keep=1)
    with pytest.raises(CheckpointError, match="No space left"):
        ckpt.save(state(1, size=600), step=10)  # 1.4 MB on a 1 MiB disk
    assert leftovers(small_disk) == []
    saved = ckpt.save(state(2, size=64), step=20)  # 16 KB: room was not kept by a leftover
    assert saved.nbytes < 40_000
    assert ckpt.load()[0] == 20


def test_retention_makes_room_before_writing_when_space_is_short(small_disk) -> None:
    ckpt = DiskCheckpointer(small_disk, keep=2)
    for step in (10, 20):
        ckpt.save(state(step, size=200), step=step)  # 160 KB each
    ckpt.save(state(30, size=350), step=30)  # 490 KB: only fits once step 10 is gone
    assert ckpt.complete_steps()[0] == 30
    assert leftovers(small_disk) == []


def test_retention_before_writing_keeps_the_newest_complete_checkpoint(tmp_path) -> None:
    free = {"bytes": 10**12}
    ckpt = DiskCheckpointer(tmp_path, keep=3, free_bytes=lambda path: free["bytes"])
    for step in (10, 20, 30):
        ckpt.save(state(step), step=step)
    (tmp_path / "step-00000025").mkdir()  # an incomplete leftover of a crash
    free["bytes"] = 0
    ckpt.save(state(40), step=40)
    assert ckpt.complete_steps() == [40, 30]
    assert not (tmp_path / "step-00000025").exists()


@pytest.mark.parametrize(
    ("file", "content"),
    [
        (MANIFEST, "null"),
        (MANIFEST, "[]"),
        (MANIFEST, '"text"'),
        ("rank-00000.json", "[]"),
        ("rank-00000.json", "null"),
        ("rank-00000.json", "[" * 100_000),
        ("rank-00000.json", '{"bytes": "x", "sha256": 5}'),
    ],
)
def test_a_manifest_of_the_wrong_shape_falls_back_like_a_corrupt_one(tmp_path, file, content):
    ckpt = DiskCheckpointer(tmp_path, keep=3)
    ckpt.save(state(1), step=10)
    ckpt.save(state(2), step=20)
    (tmp_path / "step-00000020" / file).write_text(content)
    step, loaded = ckpt.load()
    assert step == 10
    assert loaded["data"] == {"position": 1}


def test_every_checkpoint_corrupt_is_not_no_checkpoint(tmp_path) -> None:
    ckpt = DiskCheckpointer(tmp_path, keep=3)
    assert ckpt.load() is None  # nothing saved: start fresh
    for step in (10, 20):
        ckpt.save(state(step), step=step)
        (tmp_path / f"step-{step:08d}" / "rank-00000.pt").write_bytes(b"garbage")
    with pytest.raises(CheckpointsUnusable, match="2 checkpoint.*none usable"):
        ckpt.load()


def test_a_state_of_another_shape_or_dtype_is_refused(tmp_path) -> None:
    ckpt = DiskCheckpointer(tmp_path, keep=3)
    ckpt.save(state(1), step=10)
    like = {"model": {"w": torch.zeros(64, 64)}}
    assert ckpt.load(like=like)[0] == 10
    for other in (torch.zeros(32, 64), torch.zeros(64, 64, dtype=torch.float64)):
        with pytest.raises(CheckpointsUnusable, match="model.w is"):
            ckpt.load(like={"model": {"w": other}})
    with pytest.raises(CheckpointsUnusable, match="model.bias is missing"):
        ckpt.load(like={"model": {"w": torch.zeros(64, 64), "bias": torch.zeros(64)}})


def test_an_older_checkpoint_of_the_right_shape_is_used(tmp_path) -> None:
    ckpt = DiskCheckpointer(tmp_path, keep=3)
    ckpt.save(state(1, size=8), step=10)
    ckpt.save(state(2, size=16), step=20)  # the model changed shape since
    step, _ = ckpt.load(like={"model": {"w": torch.zeros(8, 8)}})
    assert step == 10


SAVE_OVER_LIMIT = """
import resource, signal, sys
import torch
from ft_runtime.checkpoint import DiskCheckpointer
from ft_runtime.errors import CheckpointError
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))
try:
    DiskCheckpointer(sys.argv[1]).save({"w": torch.zeros(600, 600)}, step=10)
except CheckpointError as exc:
    print("refused:", exc)
"""


def test_a_failed_write_leaves_no_temporary_file_without_a_small_disk(tmp_path) -> None:
    """The same path as ENOSPC, reachable without the right to mount: a file size limit."""
    result = subprocess.run(
        [sys.executable, "-c", SAVE_OVER_LIMIT, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "refused:" in result.stdout, result.stderr
    assert leftovers(tmp_path) == []
    assert DiskCheckpointer(tmp_path).load() is None
