"""Telling a running rank from a stopped or blocked one, with real processes."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from ft_runtime.procstat import ProcSample, exited, running, sample, stopped

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads Linux's /proc")


def child(code: str) -> subprocess.Popen[bytes]:
    """A process running ``code`` once its interpreter has started."""
    ready = "import sys; sys.stdout.write('ready\\n'); sys.stdout.flush()\n"
    process = subprocess.Popen([sys.executable, "-c", ready + code], stdout=subprocess.PIPE)
    assert process.stdout is not None
    assert process.stdout.readline() == b"ready\n"
    return process


def until_state(pid: int, states: str) -> None:
    """Waits until the process is in one of ``states`` (a signal lands when it runs)."""
    deadline = time.monotonic() + 10
    while (now := sample(pid)) is None or now.state not in states:
        assert time.monotonic() < deadline, now
        time.sleep(0.01)


def two_looks(pid: int) -> tuple[ProcSample | None, ProcSample | None]:
    before = sample(pid)
    time.sleep(0.05)
    return before, sample(pid)


def test_a_busy_process_is_running_and_a_stopped_one_is_not() -> None:
    busy = child("while True: pass")
    try:
        assert running(*two_looks(busy.pid))
        busy.send_signal(signal.SIGSTOP)
        until_state(busy.pid, "T")
        before, now = two_looks(busy.pid)
        assert now is not None
        assert now.state == "T"
        assert not running(before, now)
        assert stopped(now)
        busy.send_signal(signal.SIGCONT)
        until_state(busy.pid, "RS")
        assert not stopped(sample(busy.pid))
    finally:
        busy.kill()
        busy.wait()


def test_a_blocked_process_is_not_running_and_an_unknown_one_is_not_either() -> None:
    blocked = child("import time; time.sleep(60)")
    try:
        until_state(blocked.pid, "S")  # past its last write, asleep
        before, now = two_looks(blocked.pid)
        assert now is not None
        assert now.state == "S"
        assert before is not None
        assert now.cpu_ns == before.cpu_ns
        assert not running(before, now)
        assert not stopped(now)  # blocked is not stopped: the limit judges it
        assert not exited(now)
        blocked.kill()
        until_state(blocked.pid, "ZX")
        assert exited(sample(blocked.pid))  # a zombie until reaped
    finally:
        blocked.kill()
        blocked.wait()
    assert sample(blocked.pid) is None  # reaped: /proc has nothing on it
    assert exited(None)
    assert not running(None, None)
