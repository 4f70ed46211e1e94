"""Hypothesis fuzz of a live holder: every request, however malformed, gets a reply and
the holder stays up and keeps serving."""

from __future__ import annotations

import json

import pytest
import torch
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ft_runtime.ckpt import CheckpointClient, ClientConfig
from tests.test_fuzz_decoders import json_values

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))


def _json_bytes(value: object) -> bytes:
    return json.dumps(value, allow_nan=True).encode()


@pytest.mark.integration
def test_a_live_holder_answers_fuzzed_requests_and_stays_up(holders) -> None:
    ring, procs = holders(1, token="t0ken")
    sock = zmq.Context.instance().socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 5000)
    sock.connect(ring.endpoint("node0"))
    ops = st.sampled_from(
        [
            "ping",
            "alloc",
            "commit",
            "list",
            "read",
            "fetch",
            "backup_begin",
            "backup_chunk",
            "backup_end",
            "rebackup",
            "events",
            "request",
            "nope",
        ]
    )
    requests = st.fixed_dictionaries(
        {"op": ops, "token": st.sampled_from(["t0ken", "", "wrong"])},
        optional={
            k: json_values
            for k in (
                "step",
                "shard",
                "nshards",
                "nbytes",
                "owner",
                "segment",
                "offset",
                "length",
                "meta",
                "key",
            )
        },
    ).map(_json_bytes)

    @FUZZ
    @given(st.binary(max_size=200) | requests, st.lists(st.binary(max_size=64), max_size=2))
    def ask(head: bytes, extra: list[bytes]) -> None:
        sock.send_multipart([head, *extra])
        reply = json.loads(sock.recv_multipart()[0])
        assert isinstance(reply.get("ok"), bool)

    try:
        ask()
    finally:
        sock.close()
    assert procs[0].proc is not None
    assert procs[0].proc.poll() is None
    c = CheckpointClient(ClientConfig("node0", ring, token="t0ken"))
    assert c.save({"w": torch.ones(10)}, 99).ok  # still serving, and correctly
