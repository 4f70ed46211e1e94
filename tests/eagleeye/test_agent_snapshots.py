"""The pieces of snapshots across hosts that need no second host: the ring the
controller builds from the agents' hellos, the holder an agent starts from it, the token
every host derives from the job's secret, and a surviving host's holder told the ring in
which a spare's holder took a lost host's place."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import zmq

from eagleeye.agents.snapshots import HostHolder, holder_endpoint, ring_of
from eagleeye.agents.wire import holder_token
from eagleeye.errors import EagleEyeError
from ft_runtime.ckpt._rpc import Rpc
from ft_runtime.errors import CheckpointError
from ft_runtime.layout import JobLayout


def test_the_ring_lists_every_node_rank_in_order() -> None:
    ring = ring_of({1: "tcp://10.0.0.2:5600", 0: "tcp://10.0.0.1:5600"})
    assert ring == "node0=tcp://10.0.0.1:5600,node1=tcp://10.0.0.2:5600"


def test_a_node_without_a_holder_is_named() -> None:
    with pytest.raises(EagleEyeError, match=r"node ranks \[1\].*--advertise"):
        ring_of({0: "tcp://10.0.0.1:5600", 1: ""})


def test_the_token_is_the_same_on_every_host_and_needs_the_secret() -> None:
    assert holder_token(b"a" * 32) == holder_token(b"a" * 32)
    assert holder_token(b"a" * 32) != holder_token(b"b" * 32)
    assert len(holder_token(b"a" * 32)) == 32


def test_an_endpoint_is_an_address_and_a_free_port() -> None:
    endpoint = holder_endpoint("localhost")
    assert endpoint.startswith("tcp://127.0.0.1:")
    assert int(endpoint.rsplit(":", 1)[1]) > 0
    assert holder_endpoint("127.0.0.1", 5999) == "tcp://127.0.0.1:5999"
    with pytest.raises(EagleEyeError, match="does not resolve"):
        holder_endpoint("no-such-host.invalid")


@pytest.mark.parametrize(
    ("ring", "wrong"),
    [
        ("node0=tcp://127.0.0.1:5998,node1=tcp://127.0.0.1:5999", "names 'tcp://127.0.0.1:5999'"),
        ("node0", "malformed"),
    ],
)
def test_a_ring_that_does_not_name_this_hosts_holder_is_refused(ring: str, wrong: str) -> None:
    with pytest.raises(EagleEyeError, match=wrong):
        HostHolder(ring, 1, "tcp://127.0.0.1:5000", "job", "/tmp", "t" * 32, JobLayout(2, 1))


def test_an_agent_runs_only_its_own_nodes_holder_with_the_jobs_token(tmp_path) -> None:
    mine, other = holder_endpoint("127.0.0.1"), holder_endpoint("127.0.0.1")
    ring = ring_of({0: other, 1: mine})
    token = holder_token(b"s" * 32)
    with HostHolder(ring, 1, mine, "t-agent-holder", tmp_path, token, JobLayout(2, 1)) as held:
        assert held.env["EE_CKPT_TOKEN"] == token
        assert [p.cfg.node for p in held.holders.processes] == ["node1"]
        rpc = Rpc(zmq.Context.instance(), mine, 5.0, token)
        try:
            head, _ = rpc.call({"op": "ping"})
        finally:
            rpc.close()
        assert head["node"] == "node1"
        stranger = Rpc(zmq.Context.instance(), mine, 5.0, "x" * 32)
        try:
            with pytest.raises(CheckpointError, match="token"):
                stranger.call({"op": "list"})
        finally:
            stranger.close()


def _held(endpoint: str, owner: str, token: str) -> list[int]:
    rpc = Rpc(zmq.Context.instance(), endpoint, 5.0, token)
    try:
        head, _ = rpc.call({"op": "list", "owner": owner})
    finally:
        rpc.close()
    return sorted(s["step"] for s in head["slots"])


def _wait(pred: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + 30
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.mark.integration
def test_a_surviving_hosts_holder_learns_the_ring_with_the_spare_and_keeps_its_memory(
    tmp_path: Path,
) -> None:
    from ft_runtime.ckpt import CheckpointClient, ClientConfig
    from ft_runtime.ckpt.config import parse_ring

    a, b, spare = (holder_endpoint("127.0.0.1") for _ in range(3))
    token = holder_token(b"s" * 32)
    layout, job = JobLayout(2, 1), "t-agent-ring"
    first, second = ring_of({0: a, 1: b}), ring_of({0: a, 1: spare})
    with HostHolder(first, 0, a, job, tmp_path / "a", token, layout) as survivor:
        with HostHolder(first, 1, b, job, tmp_path / "b", token, layout):
            cfg = ClientConfig("node0", parse_ring(first), token=token)
            client = CheckpointClient(cfg)
            assert client.save({"w": torch.arange(10.0)}, 10).ok
            client.close()
            _wait(lambda: _held(b, "node0", token) == [10], "node0 backed up on host B")
        # host B is gone; the spare's agent starts node1's holder in the new ring
        with HostHolder(second, 1, spare, job, tmp_path / "d", token, layout):
            assert survivor.update(second) is True
            assert survivor.update(second) is False  # the same ring again: nothing to do
            assert second in survivor.env.values()  # the ranks get the new ring
            assert [p.cfg.ring for p in survivor.holders.processes] == [parse_ring(second)]
            _wait(lambda: _held(spare, "node0", token) == [10], "node0 backed up on the spare")
            assert _held(a, "node0", token) == [10]  # the survivor's memory is kept
        moved = ring_of({0: spare, 1: a})
        with pytest.raises(EagleEyeError, match="names .* for node0"):
            survivor.update(moved)
