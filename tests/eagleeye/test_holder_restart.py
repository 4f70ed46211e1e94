"""A snapshot holder that dies is started again; meanwhile its ranks' saves fail at once,
and afterwards they save and restore through the new one."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch

from eagleeye.snapshots import Holders, RankSnapshots
from ft_runtime.layout import JobLayout

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def wait_for(predicate, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_a_killed_holder_is_restarted_and_saves_resume(tmp_path) -> None:
    state = {"w": torch.arange(1000, dtype=torch.float32)}
    with Holders(JobLayout(), f"t{os.getpid()}", tmp_path / "snapshots") as holders:
        assert holders.env["EE_CKPT_TOKEN"] == holders.token
        rank = RankSnapshots.from_env(holders.env, "node0", 0, 1)
        assert rank is not None
        assert rank.save(state, 1).ok
        first = holders.processes[0].proc
        assert first is not None
        os.kill(first.pid, signal.SIGKILL)
        wait_for(lambda: first.poll() is not None, "the kill")
        failed = rank.save(state, 2)  # the holder is gone: fails, does not hang the rank
        assert not failed.ok
        wait_for(lambda: holders.restarts == 1, "the restart")
        wait_for(lambda: rank.save(state, 3).ok, "a save through the new holder")
        wait_for(lambda: holders.processes[0].proc is not first, "the new process in place")
        restored = rank.load()
        assert restored is not None
        assert restored.step == 3
        assert torch.equal(restored.state["w"], state["w"])
        rank.close()
