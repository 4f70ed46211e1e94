"""Persistence onto a full disk: a clear error, training goes on, memory tier intact."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import torch

from ft_runtime.ckpt import CheckpointClient, ClientConfig, StateChange, StateWatcher, Tier
from tests.ft_runtime.ckpt.conftest import RingFactory, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs: any checkpoint bigger than that cannot be persisted."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
        check=False,
    )
    if res.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {res.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_full_disk_is_reported_and_memory_keeps_serving(
    holders: RingFactory, tiny_disk: Path
) -> None:
    ring, _ = holders(1, storage=str(tiny_disk))
    seen: list[StateChange] = []
    watcher = StateWatcher(ring, seen.append)
    c = CheckpointClient(
        ClientConfig("node0", ring, storage=str(tiny_disk), timeout=timedelta(seconds=2))
    )
    states = {s: {"w": torch.full((600_000,), float(s)), "step": s} for s in (1, 2)}  # 2.4 MB
    assert c.save(states[1], 1).ok

    def errored() -> bool:
        watcher.poll()
        return any(e.step == 1 and e.error for e in seen)

    wait_for(errored, what="the persistence error event")
    err = next(e for e in seen if e.step == 1 and e.error)
    assert "No space left on device" in err.error
    assert "stays in memory" in err.error
    assert err.state.value == "cached"  # not BROKEN: the memory copy is whole
    assert not list(tiny_disk.glob("**/manifest.json"))
    assert not list(tiny_disk.glob("**/.tmp-*"))  # the partial write was cleaned up

    assert c.save(states[2], 2).ok  # training goes on
    got = c.load()
    assert got is not None
    assert got.step == 2
    assert got.tier == Tier.MEMORY
    assert torch.equal(got.state["w"], states[2]["w"])
