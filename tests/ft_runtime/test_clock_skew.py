"""A rank whose clock is off by minutes is judged by the controller's clock alone: healthy
while it beats, hung once it is stopped. The rank is a real process under libfaketime (its
wall clock 15 minutes behind), paced in lockstep with a rank on the true clock, as the
ranks of an exchange are."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

from ft_runtime.layout import JobLayout
from ft_runtime.quorum import QuorumService
from ft_runtime.replica import ReplicaSupervisor
from ft_runtime.replica.protocol import Heartbeat, decode, key_heartbeat
from ft_runtime.supervisor import LaunchSpec
from ft_runtime.types import Phase

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(180)]

FAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
SKEW = "-15m"
# Rank 1 re-executes itself under libfaketime (same pid: the supervisor still owns it).
# Each rank beats as it enters step s, then waits until the other entered s: an exchange.
# It sleeps with select(): libfaketime, leaving the monotonic clock true, makes time.sleep
# (an absolute monotonic deadline) fail.
RANK = """
import os, select, sys, time
rank = int(os.environ["RANK"])
if rank == 1 and "FAKETIME" not in os.environ:
    env = dict(os.environ, LD_PRELOAD=sys.argv[1], FAKETIME=sys.argv[2],
               FAKETIME_DONT_FAKE_MONOTONIC="1")
    os.execve(sys.executable, [sys.executable, *sys.argv], env)
from ft_runtime.replica.auth import JobSecret
from ft_runtime.replica.protocol import Heartbeat, decode, encode, key_heartbeat
from ft_runtime.replica.store import connect
store = connect(os.environ["EAGLEEYE_QUORUM"], JobSecret.from_env())
print(f"wall clock {time.time():.3f}", flush=True)
peer = key_heartbeat(1 - rank)
for step in range(100000):
    store.set(key_heartbeat(rank), encode(Heartbeat(step + 1, step)))
    while not store.check([peer]) or decode(Heartbeat, store.get(peer)).step < step:
        select.select([], [], [], 0.005)
    select.select([], [], [], 0.1)
"""


def _step_of(sup: ReplicaSupervisor, rank: int) -> int:
    store, key = sup.quorum.store, key_heartbeat(rank)
    assert store is not None
    return decode(Heartbeat, store.get(key)).step if store.check([key]) else -1


def _drive(sup: ReplicaSupervisor, until, timeout_s: float) -> list:
    """Polls as the controller's ticks do (0.05 s) until ``until(events)``."""
    events: list = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        events += sup.poll() + sup.settle()
        if until(events):
            return events
        time.sleep(0.05)
    raise AssertionError(f"timed out; events so far: {events}")


def _hung(events: list, replica: int) -> list:
    return [e for e in events if e.subject == f"replica:{replica}" and e.phase is Phase.EXITED]


@pytest.mark.skipif(
    not FAKETIME.exists(), reason="needs libfaketime: run scripts/install-system-deps.sh"
)
def test_a_rank_with_a_skewed_clock_is_healthy_while_it_beats_and_hung_when_stopped(
    tmp_path: Path,
) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    launch = LaunchSpec(
        [str(script), str(FAKETIME), SKEW],
        JobLayout(2, 1, 2),
        "skew",
        str(tmp_path / "logs"),
        stop_grace_s=1.0,
    )
    sup = ReplicaSupervisor(launch, QuorumService(2, 1))
    sup.start()
    try:
        # Healthy: 30 lockstep steps, and nobody is judged hung (the old heartbeats, stamped
        # with each rank's clock, made the others look 15 minutes late at once).
        events = _drive(sup, lambda _: min(_step_of(sup, 0), _step_of(sup, 1)) >= 30, 90)
        assert _hung(events, 0) == []
        assert _hung(events, 1) == []
        log = (tmp_path / "logs" / "replica-1-0" / "rank-1.log").read_text()
        skewed = float(re.search(r"wall clock ([\d.]+)", log).group(1))  # type: ignore[union-attr]
        assert time.time() - skewed > 10 * 60  # its clock really is minutes behind

        # Stopped: found hung from the heartbeats, on the controller's clock.
        os.kill(sup.pids()[1], signal.SIGSTOP)
        events = _drive(sup, lambda ev: bool(_hung(ev, 1)), 30)
        (hung,) = _hung(events, 1)
        assert hung.detail["reason"].startswith("hung")
        assert hung.detail["evidence"]["late_ranks"] == [1]
        assert _hung(events, 0) == []
        assert sup.quorum.current.members == (0,)
    finally:
        sup.stop_all()
