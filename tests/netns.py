"""Hosts for tests: Linux network namespaces joined by veth pairs and a bridge.

``NetHosts(n)`` makes ``n`` namespaces, each with one address on a private /24 behind a
bridge in the root namespace, and removes them (and every process left in them) on exit.
Making them needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN); ``need_netns()`` skips a test
with the reason when this machine cannot.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Any

import pytest


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def need_netns() -> None:
    """Skips the calling test, saying why, where network namespaces cannot be made."""
    if shutil.which("ip") is None:
        pytest.skip("iproute2's `ip` is not installed: no network namespaces")
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (CAP_NET_ADMIN, CAP_SYS_ADMIN)")
    probe = f"eeprobe{os.getpid()}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        pytest.skip(f"cannot make a network namespace here: {made.stderr.strip()}")
    _ip("netns", "del", probe, check=False)


class NetHosts:
    """``n`` hosts: namespace ``names[i]`` with address ``addresses[i]``."""

    def __init__(self, n: int, subnet: int | None = None) -> None:
        tag = f"{os.getpid() % 10000:04d}"
        third = subnet if subnet is not None else 16 + os.getpid() % 200
        self.bridge = f"eebr{tag}"
        self.names = [f"eehost{tag}{i}" for i in range(n)]
        self.addresses = [f"10.231.{third}.{i + 1}" for i in range(n)]
        self._links = [(f"eev{tag}{i}", f"eep{tag}{i}") for i in range(n)]
        self._procs: list[subprocess.Popen[Any]] = []

    def __enter__(self) -> NetHosts:
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("link", "set", self.bridge, "up")
            for name, address, (outer, inner) in zip(
                self.names, self.addresses, self._links, strict=True
            ):
                _ip("netns", "add", name)
                _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
                _ip("link", "set", inner, "netns", name)
                _ip("link", "set", outer, "master", self.bridge)
                _ip("link", "set", outer, "up")
                _ip("-n", name, "addr", "add", f"{address}/24", "dev", inner)
                _ip("-n", name, "link", "set", inner, "up")
                _ip("-n", name, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise
        return self

    def popen(self, host: int, argv: Sequence[str], **options: Any) -> subprocess.Popen[Any]:
        """Starts ``argv`` on host ``host`` (in its namespace)."""
        proc = subprocess.Popen(["ip", "netns", "exec", self.names[host], *argv], **options)
        self._procs.append(proc)
        return proc

    def ifname(self, host: int) -> str:
        """The name of host ``host``'s network interface (GLOO_SOCKET_IFNAME)."""
        return self._links[host][1]

    def pids(self, host: int) -> list[int]:
        """Every process living in host ``host``'s namespace."""
        out = _ip("netns", "pids", self.names[host], check=False).stdout
        return [int(pid) for pid in out.split()]

    def cut(self, host: int) -> None:
        """Takes host ``host``'s link down (a cable pulled)."""
        _ip("link", "set", self._links[host][0], "down")

    def restore(self, host: int) -> None:
        """Brings host ``host``'s link back up (the cable plugged in again)."""
        _ip("link", "set", self._links[host][0], "up")

    def close(self) -> None:
        for host in range(len(self.names)):
            for pid in self.pids(host):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
        for name in self.names:
            _ip("netns", "del", name, check=False)
        for outer, _ in self._links:
            _ip("link", "del", outer, check=False)
        _ip("link", "del", self.bridge, check=False)

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def read_json_line(proc: subprocess.Popen[str], want: Any, limit: float = 150.0) -> dict[str, Any]:
    """The next JSON line of the controller that ``want`` accepts (others are skipped)."""
    assert proc.stdout is not None
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError("the controller ended early")
        item = json.loads(line)
        if want(item):
            return dict(item)
    raise AssertionError("not seen in time")
