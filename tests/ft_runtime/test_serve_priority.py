"""The catch-up server's threads run below the training thread, and a refusal is harmless."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from ft_runtime.catchup import SnapshotServer, fetch_snapshot
from ft_runtime.priority import thread_nice

ROOT = Path(__file__).resolve().parents[2]


def nices_of(name: str, seen: dict[str, int], timeout_s: float = 10.0) -> int:
    """The nice value of a live thread called ``name``, read by its thread id."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for thread in threading.enumerate():
            if thread.name == name and thread.native_id is not None:
                try:
                    seen[name] = os.getpriority(os.PRIO_PROCESS, thread.native_id)
                    return seen[name]
                except ProcessLookupError:  # it ended between the listing and the read
                    continue
        time.sleep(0.005)
    raise AssertionError(f"no live thread {name!r} within {timeout_s} s")


@pytest.mark.parametrize("serve_nice", [0, 7])
def test_serving_threads_run_at_the_lowered_priority(serve_nice: int) -> None:
    base = thread_nice()
    # Slow chunks (0.3 s each at this rate) keep a serving thread alive long enough to read.
    server = SnapshotServer(rate_bytes_s=200_000, chunk_bytes=60_000, serve_nice=serve_nice)
    try:
        server.publish("t", 3, {"w": torch.arange(60_000.0)})  # 240 kB: four chunks
        fetched: dict[str, object] = {}
        fetcher = threading.Thread(
            target=lambda: fetched.update(state=fetch_snapshot(server.address, "t")[1])
        )
        fetcher.start()
        seen: dict[str, int] = {}
        nices_of("snapshots", seen)
        nices_of("catchup-serve", seen)
        fetcher.join(30)
        assert torch.equal(fetched["state"]["w"], torch.arange(60_000.0))  # type: ignore[index]
    finally:
        server.close()
    expected = min(base + serve_nice, 19)
    assert seen == {"snapshots": expected, "catchup-serve": expected}
    assert thread_nice() == base  # the creating (training) thread keeps its priority
    assert not server.refused


CHILD = """
import ctypes, json, logging, os, resource, threading
resource.setrlimit(resource.RLIMIT_NICE, (0, 0))  # no raising of a priority
if os.geteuid() == 0:  # root raises priorities through CAP_SYS_NICE: drop it
    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
    class Caps(ctypes.Structure):
        _fields_ = [(n, ctypes.c_uint32) for n in ("effective", "permitted", "inheritable")]
    libc = ctypes.CDLL(None, use_errno=True)
    header, caps = Header(0x20080522, 0), (Caps * 2)()  # version 3: two 32-bit words
    assert libc.capget(ctypes.byref(header), caps) == 0
    caps[0].effective &= ~(1 << 23)  # CAP_SYS_NICE
    caps[0].permitted &= ~(1 << 23)
    assert libc.capset(ctypes.byref(header), caps) == 0, ctypes.get_errno()
logging.basicConfig(level=logging.WARNING)
import torch
from ft_runtime.catchup import SnapshotServer, fetch_snapshot
from ft_runtime.priority import thread_nice
server = SnapshotServer(serve_nice=-5, chunk_bytes=1000)
server.publish("t", 3, {"w": torch.arange(1000.0)})
step, state = fetch_snapshot(server.address, "t")
accept = next(t for t in threading.enumerate() if t.name == "snapshots")
print(json.dumps({
    "step": step,
    "exact": torch.equal(state["w"], torch.arange(1000.0)),
    "base": thread_nice(),
    "serving": thread_nice(accept.native_id),
    "refused": server.refused,
}))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="per-thread nice values are Linux's")
def test_a_refused_priority_change_never_breaks_serving() -> None:
    # A raise of the priority without the privilege for it is refused by the system: the
    # child has no RLIMIT_NICE room and, as root, drops CAP_SYS_NICE first.
    child = subprocess.run(
        [sys.executable, "-c", CHILD],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=50,
        check=False,
    )
    assert child.returncode == 0, child.stderr
    report = json.loads(child.stdout.strip().splitlines()[-1])
    assert report["step"] == 3
    assert report["exact"]
    assert report["refused"]
    assert report["serving"] == report["base"]  # went on at the priority it had
    # said once per thread that asked (the server's, and its serialiser's when it ran one),
    # not once per request
    said = [line for line in child.stderr.splitlines() if "could not set nice" in line]
    assert said
    assert len(said) == len(set(said)), said


RESTORE = """
import json, os, threading
from ft_runtime.replica import restore_priority

os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)  # launched lowered
release = threading.Event()
worker = threading.Thread(target=release.wait)  # started while lowered: inherits it
worker.start()
lowered = os.getpriority(os.PRIO_PROCESS, worker.native_id)
restore_priority()
print(json.dumps({
    "lowered": lowered,
    "main": os.getpriority(os.PRIO_PROCESS, threading.get_native_id()),
    "worker": os.getpriority(os.PRIO_PROCESS, worker.native_id),
}))
release.set()
"""


def test_a_joiner_that_caught_up_restores_every_thread_not_only_the_caller() -> None:
    base = thread_nice()
    env = {**os.environ, "EAGLEEYE_BASE_NICE": str(base), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", RESTORE], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    if "could not restore" in done.stderr:
        pytest.skip("raising a priority needs a privilege this process lacks")
    nices = json.loads(done.stdout)
    assert nices["lowered"] == 10
    assert (nices["main"], nices["worker"]) == (base, base)
