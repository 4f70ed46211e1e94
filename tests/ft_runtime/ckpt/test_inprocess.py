"""A holder run in-process (as the composition root may) calls back on every state change."""

from __future__ import annotations

import threading
from datetime import timedelta
from pathlib import Path

import pytest
import torch

from ft_runtime.ckpt import CheckpointClient, CkptState, ClientConfig, Holder, HolderConfig
from ft_runtime.ckpt.types import StateChange
from tests.ft_runtime.ckpt.conftest import make_ring, wait_for

pytestmark = pytest.mark.integration


def test_in_process_holder_reports_states_through_its_callback(job: str, tmp_path: Path) -> None:
    ring = make_ring(1)
    seen: list[StateChange] = []
    holder = Holder(
        HolderConfig(job, "node0", ring, storage=str(tmp_path), keep_in_memory=1),
        on_state=seen.append,
    )
    ready = threading.Event()
    t = threading.Thread(target=holder.serve_forever, args=(ready.set,), daemon=True)
    t.start()
    try:
        assert ready.wait(10)
        c = CheckpointClient(ClientConfig("node0", ring, timeout=timedelta(seconds=2)))
        for step in (1, 2):
            assert c.save({"w": torch.full((10,), float(step))}, step).ok
        wait_for(
            lambda: any(e.step == 2 and e.state == CkptState.PERSISTENT for e in seen),
            what="step 2 persisted",
        )
        by_step = {s: [e.state for e in seen if e.step == s] for s in (1, 2)}
        assert by_step[2] == [CkptState.PENDING, CkptState.CACHED, CkptState.PERSISTENT]
        assert CkptState.OBSOLESCENT in by_step[1]  # keep_in_memory=1 evicts step 1
        assert [e.seq for e in seen] == sorted(e.seq for e in seen)
        c.close()
    finally:
        holder.stop()
        t.join(10)
    assert not list(Path("/dev/shm").glob(f"eeckpt.{job}.*"))  # a clean stop frees memory
