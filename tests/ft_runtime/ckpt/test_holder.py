"""Real holder processes on loopback: tiers, states, sharding, backup, eviction, actions."""

from __future__ import annotations

import signal
from datetime import timedelta
from pathlib import Path

import pytest
import torch

from ft_runtime.ckpt import (
    CheckpointClient,
    CheckpointRuntime,
    CkptState,
    ClientConfig,
    HolderConfig,
    HolderProcess,
    Ring,
    StateChange,
    StateWatcher,
    Tier,
)
from ft_runtime.ckpt._rpc import Rpc
from ft_runtime.types import Action, ActionKind, OutcomeStatus
from tests.ft_runtime.ckpt.conftest import RingFactory, wait_for

pytestmark = pytest.mark.integration


def client(ring: Ring, node: str = "node0", **kw: object) -> CheckpointClient:
    return CheckpointClient(ClientConfig(node, ring, timeout=timedelta(seconds=1), **kw))  # type: ignore[arg-type]


def state(step: int, n: int = 10_000) -> dict[str, object]:
    g = torch.Generator().manual_seed(step)
    return {
        "model": {"w": torch.randn(n, generator=g), "i": torch.arange(7) * step},
        "rng": torch.get_rng_state(),
        "step": step,
        "data": {"position": step * 32},
    }


def same(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


class Events:
    def __init__(self, ring: Ring) -> None:
        self.seen: list[StateChange] = []
        self.watcher = StateWatcher(ring, self.seen.append)

    def states(self, step: int, node: str = "node0") -> list[CkptState]:
        self.watcher.poll()
        return [e.state for e in self.seen if e.step == step and e.node == node]


@pytest.mark.slow
def test_save_restores_bitwise_from_memory_and_walks_the_states(
    holders: RingFactory, tmp_path: Path
) -> None:
    ring, _ = holders(2, storage=str(tmp_path))
    ev = Events(ring)
    c = client(ring, storage=str(tmp_path))
    for step in (1, 2):
        assert c.save(state(step), step).ok
    wait_for(lambda: CkptState.PERSISTENT in ev.states(2), what="step 2 persisted")
    assert ev.states(2) == [
        CkptState.PENDING,
        CkptState.CACHED,
        CkptState.BACKED_UP,
        CkptState.PERSISTENT,
    ]
    got = client(ring, storage=str(tmp_path)).load()
    assert got is not None
    assert got.step == 2
    assert got.tiers == (Tier.MEMORY,)
    assert same(got.state, state(2))


def test_dp_replicas_each_hold_one_shard_and_load_reassembles(holders: RingFactory) -> None:
    ring, _ = holders(2)
    c0, c1 = (client(ring, f"node{r}", dp_rank=r, dp_size=2) for r in (0, 1))
    full = client(ring).save(state(1), 1).nbytes
    r0, r1 = c0.save(state(5), 5), c1.save(state(5), 5)
    assert r0.ok
    assert r1.ok
    assert r0.nbytes <= full / 2 + 128
    assert r1.nbytes == r0.nbytes
    got = c0.load()
    assert got is not None
    assert got.step == 5
    # shard 1 comes from node1's holder, or from node0's own memory once node1's ring
    # backup of it has landed there (both are whole, committed copies)
    assert got.tiers[0] == Tier.MEMORY
    assert got.tiers[1] in (Tier.MEMORY, Tier.PEER)
    assert same(got.state, state(5))
    template = state(0)
    w = template["model"]["w"]  # type: ignore[index]
    got = c1.load(into=template)
    assert got is not None
    assert got.state["model"]["w"] is w  # filled in place, not reallocated
    assert same(got.state, state(5))


@pytest.mark.slow
def test_lost_node_restores_from_the_neighbour_then_pulls_its_backups_back(
    holders: RingFactory, job: str
) -> None:
    ring, procs = holders(2)
    ev = Events(ring)
    c = client(ring)
    for step in (1, 2):
        assert c.save(state(step), step).ok
    wait_for(lambda: CkptState.BACKED_UP in ev.states(2), what="step 2 backed up")
    procs[0].kill()
    for seg in Path("/dev/shm").glob(f"eeckpt.{job}.node0.*"):
        seg.unlink()  # the node's memory is gone with it
    got = client(ring).load()
    assert got is not None
    assert got.step == 2
    assert got.tier == Tier.PEER
    assert same(got.state, state(2))

    restarted = HolderProcess(HolderConfig(job, "node0", ring)).start()
    try:
        wait_for(
            lambda: (r := client(ring).load()) is not None and r.tier == Tier.MEMORY,
            what="the restarted holder to pull its backups back",
        )
        got = client(ring).load()
        assert got is not None
        assert got.step == 2
        assert same(got.state, state(2))
    finally:
        restarted.stop()


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_damaged_persisted_checkpoint_falls_back_to_the_previous_one(
    holders: RingFactory, tmp_path: Path, damage: str
) -> None:
    ring, procs = holders(1, storage=str(tmp_path))
    ev = Events(ring)
    c = client(ring, storage=str(tmp_path))
    for step in (1, 2):
        assert c.save(state(step), step).ok
    wait_for(lambda: CkptState.PERSISTENT in ev.states(2), what="step 2 persisted")
    procs[0].stop()  # memory tier gone: only storage is left
    data = tmp_path / "step_0000000002/shard_0-of-1/__0_0.distcp"
    raw = bytearray(data.read_bytes())
    if damage == "flip":
        raw[len(raw) // 3] ^= 0x01
    else:
        raw = raw[: len(raw) - 17]
    data.write_bytes(bytes(raw))
    got = client(ring, storage=str(tmp_path)).load()
    assert got is not None
    assert got.step == 1
    assert got.tier == Tier.STORAGE
    assert same(got.state, state(1))
    assert any("step 2" in s and ("sha256" in s or "bytes" in s) for s in got.skipped)


def test_window_and_memory_cap_evict_old_iterations(holders: RingFactory) -> None:
    size = client_bytes = 10_000 * 4 + 1024
    ring, _ = holders(1, keep_in_memory=2, mem_cap_bytes=int(2.5 * size))
    ev = Events(ring)
    c = client(ring)
    for step in range(1, 5):
        assert c.save(state(step), step).ok
    assert CkptState.OBSOLESCENT in ev.states(1)
    assert CkptState.OBSOLESCENT in ev.states(2)
    head, _ = Rpc(c._ctx, ring.endpoint("node0"), 1.0).call({"op": "list"})
    assert sorted(s["step"] for s in head["slots"]) == [3, 4]
    big = c.save(state(9, n=4 * client_bytes), 9)
    assert not big.ok
    assert "memory cap" in big.error
    got = c.load()
    assert got is not None
    assert got.step == 4
    assert same(got.state, state(4))


def test_save_interrupted_before_commit_is_broken_and_skipped(holders: RingFactory) -> None:
    ring, _ = holders(1)
    ev = Events(ring)
    c = client(ring)
    assert c.save(state(1), 1).ok
    rpc = Rpc(c._ctx, ring.endpoint("node0"), 1.0)  # a trainer that died mid-copy
    rpc.call({"op": "alloc", "step": 2, "shard": 0, "nshards": 1, "nbytes": 100})
    got = c.load()
    assert got is not None
    assert got.step == 1
    assert c.save(state(3), 3).ok
    assert ev.states(2) == [CkptState.PENDING, CkptState.BROKEN]


def test_checkpoint_action_requests_a_save_once_per_key(
    holders: RingFactory, tmp_path: Path
) -> None:
    ring, _ = holders(1, storage=str(tmp_path), persist_every=1000)
    ev = Events(ring)
    c = client(ring)
    rt = CheckpointRuntime(ring)
    assert not c.save_requested()
    act = Action(ActionKind.CHECKPOINT, "job", "xid 79 on node0", "ckpt/1")
    assert rt.execute(act).status == OutcomeStatus.DONE
    assert c.save_requested()
    assert c.save(state(7), 7).ok
    assert not c.save_requested()
    assert rt.execute(act).status == OutcomeStatus.SKIPPED  # same key: no second save
    assert not c.save_requested()
    wait_for(lambda: CkptState.PERSISTENT in ev.states(7), what="forced persistence")
    other = Action(ActionKind.EVICT, "node:node0", "x", "evict/1")
    assert rt.execute(other).status == OutcomeStatus.SKIPPED


def test_a_holder_sent_sigterm_again_and_again_still_ends(holders: RingFactory) -> None:
    # its parent's death and a stop can both send SIGTERM; the handler then interrupts
    # itself, and one that took a lock (a threading.Event) deadlocked the holder for good
    _, (holder,) = holders(1)
    assert holder.proc is not None
    for _ in range(2000):
        if holder.proc.poll() is not None:
            break
        holder.proc.send_signal(signal.SIGTERM)
    assert holder.proc.wait(timeout=20) == 0
