"""Ports handed to a process that binds them later lie outside the ephemeral range."""

from __future__ import annotations

import socket

from ft_runtime import ports
from ft_runtime.ports import LOWEST, ephemeral_low, free_port


def test_a_port_is_taken_below_the_kernels_ephemeral_range() -> None:
    low = ephemeral_low()
    assert low is not None  # Linux
    chosen = {free_port() for _ in range(50)}
    assert all(LOWEST <= port < low for port in chosen)
    assert len(chosen) > 40  # spread, not one port handed to every caller


def test_a_port_in_use_is_never_returned(monkeypatch) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        taken = busy.getsockname()[1]
        busy.listen()
        monkeypatch.setattr(ports._pick, "randrange", lambda a, b: taken)  # every try hits it
        port = free_port(ephemeral_from=taken + 5000)
    assert port != taken  # the tries all failed: the OS picked one


def test_with_no_room_below_the_range_the_os_picks() -> None:
    assert free_port(ephemeral_from=LOWEST + 10) >= 1024


def test_an_unreadable_range_is_none(tmp_path) -> None:
    odd = tmp_path / "range"
    odd.write_text("garbage\n")
    assert ephemeral_low(odd) is None
    assert ephemeral_low(tmp_path / "missing") is None
    odd.write_text("32768\t60999\n")
    assert ephemeral_low(odd) == 32768
