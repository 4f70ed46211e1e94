"""The quorum's store process of a job whose controller can restart (``DetachedStore``):
a real process and real TCP connections. It outlives the object that started it, a
second controller reaches it at its address, it ends when told through its sealed stop
key, on its own once nobody renewed its lease, and a key not sealed with the job's secret
is no stop."""

from __future__ import annotations

import os
import subprocess
import time
from datetime import timedelta
from pathlib import Path

import pytest

from ft_runtime import _dist as dist
from ft_runtime.errors import LaunchError
from ft_runtime.ports import free_port
from ft_runtime.replica.auth import JobSecret
from ft_runtime.replica.store import SealedStore, connect
from ft_runtime.storehost import KEY_STOP, DetachedStore

SECRET = "0123456789abcdef0123456789abcdef"


def test_a_second_controller_reaches_the_store_and_its_stop_ends_it(tmp_path: Path) -> None:
    first = DetachedStore.start("127.0.0.1", SECRET, tmp_path / "store.log")
    assert os.getpgid(first.pid) == first.pid  # a session of its own: no group signal
    again = DetachedStore.attach(first.address, first.pid, SECRET)
    host, _, port = first.address.rpartition(":")
    raw = dist.TCPStore(host, int(port), timeout=timedelta(seconds=5))
    sealed = SealedStore(raw, JobSecret(SECRET))
    sealed.set("k", "v")
    assert connect(again.address, JobSecret(SECRET)).get("k") == b"v"  # the same store
    raw.set(JobSecret(SECRET).name(KEY_STOP), b"forged")  # its name, not sealed: no stop
    time.sleep(1.0)
    assert first.alive
    again.close()  # the second controller ends the job
    assert first.process is not None
    assert first.process.wait(timeout=10) == 0
    assert not again.alive


def test_a_store_nobody_renews_ends_on_its_own(tmp_path: Path) -> None:
    store = DetachedStore.start("127.0.0.1", SECRET, tmp_path / "store.log", lease_s=1.0)
    assert store.process is not None
    assert store.process.wait(timeout=20) == 3
    assert "no controller renewed the lease" in (tmp_path / "store.log").read_text()


def test_attaching_where_nothing_listens_is_one_clear_error() -> None:
    address = f"127.0.0.1:{free_port()}"
    with pytest.raises(LaunchError, match=f"the quorum's store at {address} does not answer"):
        DetachedStore.attach(address, os.getpid(), SECRET)


def test_a_store_whose_process_is_not_on_this_host_is_not_attached(tmp_path: Path) -> None:
    """A controller started on another host than the first reaches the old store over
    the network while that host lives; it must refuse (it cannot watch a process of
    another host: the job would be failed as its store lost), not attach."""
    first = DetachedStore.start("127.0.0.1", SECRET, tmp_path / "store.log")
    try:
        elsewhere = subprocess.Popen(["true"])  # its pid: no process on this host
        elsewhere.wait()
        with pytest.raises(LaunchError, match="not on this controller's host"):
            DetachedStore.attach(first.address, elsewhere.pid, SECRET)
        with pytest.raises(LaunchError, match="not on this controller's host"):
            DetachedStore.attach(first.address, os.getpid(), SECRET)  # no store process
        assert first.alive
    finally:
        first.close()
