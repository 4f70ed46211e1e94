"""Leases: after each commit the holder lends a trainer's shard the segment of its next save,
so that save copies at once and sends one request. Real holder processes on loopback."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from ft_runtime.ckpt import (
    CheckpointClient,
    CkptState,
    HolderConfig,
    HolderProcess,
    LoadResult,
    Tier,
)
from ft_runtime.ckpt._shm import open_mapping
from tests.ft_runtime.ckpt.conftest import RingFactory
from tests.ft_runtime.ckpt.test_holder import Events, client, same, state

pytestmark = pytest.mark.integration


def record_ops(c: CheckpointClient) -> list[str]:
    """The ops ``c`` sends to its own holder, in order."""
    ops: list[str] = []
    rpc = c._rpcs[c.cfg.node]
    call: Callable[..., Any] = rpc.call

    def counted(header: dict[str, Any], *a: Any, **k: Any) -> Any:
        ops.append(str(header["op"]))
        return call(header, *a, **k)

    rpc.call = counted  # type: ignore[method-assign]
    return ops


def segments(job: str) -> list[Path]:
    return list(Path("/dev/shm").glob(f"eeckpt.{job}.node0.*"))


def restores(c: CheckpointClient, step: int, want: object) -> LoadResult:
    """Loads through ``c`` and checks it got ``step``, bitwise equal to ``want``."""
    got = c.load()
    assert got is not None
    assert got.step == step
    assert same(got.state, want)
    return got


def test_a_save_after_the_first_copies_into_its_lease_with_one_request(
    holders: RingFactory,
) -> None:
    ring, _ = holders(1)
    ev = Events(ring)
    c = client(ring)
    ops = record_ops(c)
    assert c.save(state(1), 1).ok
    assert ops == ["alloc", "commit"]
    ops.clear()
    for step in (2, 3):
        assert c.save(state(step), step).ok
    assert ops == ["commit", "commit"]
    assert ev.states(3) == [CkptState.PENDING, CkptState.CACHED]
    assert restores(client(ring), 3, state(3)).tiers == (Tier.MEMORY,)


def test_a_lease_lost_with_a_restarted_holder_costs_one_retry(
    holders: RingFactory, job: str
) -> None:
    ring, procs = holders(1)
    c = client(ring)
    for step in (1, 2, 3):  # the third save recycles the first segment: mapped, then lent
        assert c.save(state(step), step).ok
    procs[0].stop()  # the lease dies with the holder, its segment deleted under our mapping
    with HolderProcess(HolderConfig(job, "node0", ring)):
        ops = record_ops(c)
        assert c.save(state(4), 4).ok
        assert ops == ["commit", "alloc", "commit"]  # the commit of the lent segment refused
        restores(client(ring), 4, state(4))
        c.close()  # unmaps the deleted segment
        fresh = client(ring)
        assert fresh.save(state(5), 5).ok
        fresh._lease = (str(Path("/dev/shm") / "eeckpt.gone"), fresh._lease[1])  # type: ignore[index]
        ops = record_ops(fresh)
        assert fresh.save(state(6), 6).ok  # a lent segment that cannot even be mapped
        assert ops == ["alloc", "commit"]


def test_a_trainer_killed_while_copying_into_its_lease_leaves_the_last_snapshot(
    holders: RingFactory, job: str
) -> None:
    ring, _ = holders(1, keep_in_memory=2)
    c = client(ring)
    for step in (1, 2):
        assert c.save(state(step), step).ok
    assert c._lease is not None
    lent, nbytes = c._lease
    half = open_mapping(Path(lent), nbytes)
    half.buf[: nbytes // 2].fill_(0xFF)  # the copy of step 3 got halfway, then SIGKILL
    half.close()
    restarted = client(ring)
    restores(restarted, 2, state(2))
    for step in (3, 4, 5):  # the dead trainer's lease goes back to the pool, not to waste
        assert restarted.save(state(step), step).ok
    assert len(segments(job)) <= 3  # two snapshots in memory and one lease
    restores(client(ring), 5, state(5))


def test_a_replaced_tensor_is_saved_from_its_new_memory(holders: RingFactory) -> None:
    ring, _ = holders(1)
    c = client(ring)
    s = state(1)
    for step in (1, 2, 3):  # alternate between the two segments so both have a copy plan
        s["model"]["w"].add_(1)  # type: ignore[index]
        assert c.save(s, step).ok
    s["model"]["w"] = torch.full((10_000,), 7.0)  # type: ignore[index]
    assert c.save(s, 4).ok
    restores(client(ring), 4, s)
