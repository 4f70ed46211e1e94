"""What a peer sends during catch-up is decoded to CatchUpError when it is not a state."""

from __future__ import annotations

import io
import pickle

import pytest
import torch

from ft_runtime.catchup import _meta, encode_update, load_state
from ft_runtime.errors import CatchUpError


class Evil:
    def __reduce__(self):
        return (print, ("pwned",))


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"garbage",
        pickle.dumps(Evil()),
        pickle.dumps([1, 2, 3])[:-3],
        b"PK\x03\x04" + b"\x00" * 100,
    ],
)
def test_a_payload_that_is_not_a_state_is_a_catch_up_error(payload: bytes) -> None:
    with pytest.raises(CatchUpError, match="update 3"):
        load_state(payload, "update 3 from peer")


def test_a_state_that_is_not_a_dict_is_a_catch_up_error() -> None:
    buffer = io.BytesIO()
    torch.save([torch.ones(2)], buffer)
    with pytest.raises(CatchUpError, match="not a dict"):
        load_state(buffer.getvalue(), "snapshot s")


def test_a_real_update_round_trips() -> None:
    state = load_state(encode_update({"update": torch.ones(3), "lr": 0.1}), "update 1")
    assert torch.equal(state["update"], torch.ones(3))


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"[]",
        b'{"step": "1", "bytes": 1, "sha256": []}',
        b'{"step": 1, "bytes": 1}',
        b"[" * 99999,
    ],
)
def test_malformed_meta_is_a_catch_up_error(body: bytes) -> None:
    with pytest.raises(CatchUpError, match="malformed meta"):
        _meta(body, "snapshot s")
