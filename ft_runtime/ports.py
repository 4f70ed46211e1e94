"""Free TCP ports for stores and servers that another process binds later.

A port chosen now and bound later is taken from below the kernel's ephemeral range when
there is room (as torchrun's 29500 is): the kernel hands ports of that range to every
outgoing connection, so one connecting in between (to a restarted server on the same
port, say) could take it. A port that is in use now is never returned.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 20000  # below it lie well-known services' ports
TRIES = 64
_pick = random.SystemRandom()  # a job's seeding of ``random`` never repeats a choice


def ephemeral_low(path: Path = EPHEMERAL_RANGE) -> int | None:
    """The first port of the kernel's ephemeral range, or None where it cannot be read."""
    try:
        low = int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return low if 1024 < low <= 65535 else None


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def free_port(host: str = "127.0.0.1", ephemeral_from: int | None = None) -> int:
    """A port free on ``host`` right now, outside the ephemeral range when the range
    leaves room below it; else one the OS picks (a race is then possible but rare).

    Args:
        host: the address the port will be bound on.
        ephemeral_from: the first ephemeral port; read from the kernel when None.
    """
    low = ephemeral_from if ephemeral_from is not None else ephemeral_low()
    if low is not None and low - LOWEST >= 1000:
        for _ in range(TRIES):
            port = _pick.randrange(LOWEST, low)
            if _bindable(host, port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
