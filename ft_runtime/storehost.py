"""The quorum's key-value store in a process of its own, so that the coordinator can restart.

Ranks read memberships, write heartbeats and set up their cross-replica groups through one
``TCPStore``. Hosted by the coordinator, it would vanish with it and take every rank's
connection along; hosted here, a coordinator can stop and a new one connect to the same
address and resume from its log (``ft_runtime.quorum``). The process prints its port on
its first line and exits when its parent closes its stdin (or dies), so it never outlives
the job's supervisor.

    python -m ft_runtime.storehost --host 127.0.0.1

A job across hosts whose controller can be restarted (``eagleeye controller --recovery
replica``) runs it ``--detached`` instead (``DetachedStore``): in a session of its own, tied
to no pipe, so it outlives a controller killed outright and a controller started again on
the same host reconnects to it. Told through the store itself, under keys sealed with the
job's secret (``EAGLEEYE_REPLICA_SECRET`` in its environment): it ends when a controller
sets the stop key (the job's end), or on its own once no controller renewed its lease for
``--lease-s`` seconds (a controller that never came back), so it never outlives the job
for long. It can outlive a controller, never the controller's host: a controller started
on another host finds nothing at the old address, or no store process of that pid on its
own host, and refuses to go on.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

from ft_runtime.errors import LaunchError
from ft_runtime.replica.protocol import KEY_STORE_LEASE, KEY_STORE_STOP

#: The sealed keys a detached store is told through: its stop, and its lease's renewals.
KEY_STOP, KEY_LEASE = KEY_STORE_STOP, KEY_STORE_LEASE
#: Seconds a detached store waits for a controller to renew its lease before it ends.
LEASE_S = 300.0


class StoreHost:
    """Starts and stops the store process.

    Args:
        host: the address ranks reach the store at. torch's ``TCPStore`` server listens on
            every interface whatever this says; what protects the store is the job's secret
            (every key opaque, every value sealed: ``ft_runtime.replica.store``).
        python: interpreter to run it with (this one by default).
    """

    def __init__(self, host: str = "127.0.0.1", python: str = "") -> None:
        self.host = host
        self.python = python or sys.executable
        self.process: subprocess.Popen[bytes] | None = None
        self.address = ""

    def start(self) -> str:
        """Launches the store; returns its ``host:port`` once it listens."""
        self.process = subprocess.Popen(
            [self.python, "-m", "ft_runtime.storehost", "--host", self.host],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline().decode().strip()
        if not line.isdigit():
            self.close()
            raise LaunchError(
                f"the quorum store did not start (said {line!r}); "
                "check that torch.distributed works on this machine"
            )
        self.address = f"{self.host}:{line}"
        return self.address

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self.process is None else self.process.returncode

    def wait_gone(self, wait_s: float) -> bool:
        """Whether the process has ended, waiting up to ``wait_s`` for it."""
        if self.process is None:
            return False
        try:
            self.process.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            return False
        return True

    def close(self) -> None:
        if self.process is None:
            return
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(5.0)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None


class DetachedStore:
    """The store process of a job whose controller can restart (``--detached``): started by
    one controller (``start``), reached again by the next (``attach``), ended by whichever
    ends the job (``close``). The controller renews its lease (``renew``) as it runs.

    Args:
        address: ``host:port`` the store listens on.
        pid: its process id (on the controller's host).
        secret: the job's quorum secret (the store's keys and values are sealed with it).
    """

    def __init__(self, address: str, pid: int, secret: str) -> None:
        from ft_runtime.replica.auth import JobSecret
        from ft_runtime.replica.store import connect

        self.address = address
        self.pid = pid
        self.process: subprocess.Popen[bytes] | None = None  # when this controller started it
        self._code: int | None = None
        self._store = connect(address, JobSecret(secret), timeout_s=5.0)
        self._renewals = 0

    @classmethod
    def start(
        cls,
        host: str,
        secret: str,
        log_path: Path,
        python: str = "",
        lease_s: float = LEASE_S,
    ) -> DetachedStore:
        """Launches the store in a session of its own; returns it once it listens."""
        from ft_runtime.replica.auth import ENV_REPLICA_SECRET

        argv = [python or sys.executable, "-m", "ft_runtime.storehost", "--host", host]
        with log_path.open("ab") as err:
            process = subprocess.Popen(
                [*argv, "--detached", "--lease-s", str(lease_s)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=err,
                env={**os.environ, ENV_REPLICA_SECRET: secret},
                start_new_session=True,  # no signal to the controller's group reaches it
            )
        assert process.stdout is not None
        line = process.stdout.readline().decode().strip()
        process.stdout.close()
        if not line.isdigit():
            process.kill()
            process.wait()
            raise LaunchError(
                f"the quorum store did not start (said {line!r}, see {log_path}); "
                "check that torch.distributed works on this machine"
            )
        store = cls(f"{host}:{line}", process.pid, secret)
        store.process = process
        return store

    @classmethod
    def attach(cls, address: str, pid: int, secret: str) -> DetachedStore:
        """The store a controller before this one started, reached at ``address``.

        Raises:
            LaunchError: nothing answers there (its host was lost, or it ended), or its
                process ``pid`` is not on this host (a controller started elsewhere).
        """
        host, _, port = address.rpartition(":")
        try:  # a plain connection first: torch logs a failed one at length
            socket.create_connection((host, int(port)), timeout=5.0).close()
        except (OSError, ValueError) as exc:
            raise LaunchError(f"the quorum's store at {address} does not answer ({exc})") from None
        if not _is_store(pid):  # it answers from another host: watched here, it reads as gone
            raise LaunchError(
                f"the quorum's store at {address} is not on this controller's host "
                f"(no store process {pid} here)"
            )
        try:
            store = cls(address, pid, secret)
            store.renew()
        except RuntimeError as exc:  # torch's DistStoreError is a RuntimeError
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            why = f"the quorum's store at {address} does not answer ({first})"
            raise LaunchError(why) from None
        return store

    def renew(self) -> None:
        """Renews the lease (the store ends once no controller did so for its lease)."""
        self._renewals += 1
        self._store.set(KEY_LEASE, f"{os.getpid()}:{self._renewals}")

    @property
    def alive(self) -> bool:
        if self.process is not None:
            return self.process.poll() is None
        return _running(self.pid)

    @property
    def returncode(self) -> int | None:
        return self.process.returncode if self.process is not None else self._code

    def wait_gone(self, wait_s: float) -> bool:
        """Whether the process has ended, waiting up to ``wait_s`` for it."""
        deadline = time.monotonic() + wait_s
        while self.alive:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def close(self, wait_s: float = 5.0) -> None:
        """Ends the store (the job ended): told through its stop key, killed if it does
        not end within ``wait_s``."""
        try:
            self._store.set(KEY_STOP, "1")
        except RuntimeError:
            pass  # gone already, or not answering: the kill below
        if not self.wait_gone(wait_s) and _is_store(self.pid):
            os.kill(self.pid, signal.SIGKILL)
            self.wait_gone(wait_s)


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, ended and not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _is_store(pid: int) -> bool:
    """Whether ``pid`` is a store process (never signal a pid reused by another)."""
    try:
        return b"ft_runtime.storehost" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ft_runtime.storehost")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--detached", action="store_true")
    parser.add_argument("--lease-s", type=float, default=LEASE_S)
    args = parser.parse_args(argv)
    from ft_runtime import _dist as dist

    store = dist.TCPStore(
        args.host, 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30)
    )
    print(store.port, flush=True)
    if args.detached:
        return _serve_detached(store, args.lease_s)
    sys.stdin.buffer.read()  # returns when the parent closes the pipe or dies
    return 0


def _serve_detached(store: object, lease_s: float) -> int:
    """Serves until a controller sets the stop key, or none renewed the lease for
    ``lease_s`` seconds (3), or SIGTERM (0)."""
    from ft_runtime import _dist as dist
    from ft_runtime.replica.auth import ENV_REPLICA_SECRET, JobSecret, Unauthenticated
    from ft_runtime.replica.store import SealedStore

    secret = os.environ.get(ENV_REPLICA_SECRET, "")
    if not secret:
        print(f"--detached needs {ENV_REPLICA_SECRET} in the environment", file=sys.stderr)
        return 2
    assert isinstance(store, dist.Store)
    sealed = SealedStore(store, JobSecret(secret))
    signal.signal(signal.SIGTERM, lambda s, f: sys.exit(0))
    lease, renewed = b"", time.monotonic()
    while True:
        time.sleep(0.1)  # the stop key is seen a tenth of a second after it is set
        try:
            if sealed.check([KEY_STOP]) and sealed.get(KEY_STOP):
                return 0
            if sealed.check([KEY_LEASE]):
                now = sealed.get(KEY_LEASE)
                if now != lease:
                    lease, renewed = now, time.monotonic()
        except Unauthenticated:
            continue  # a value not sealed with the job's secret: not a controller's word
        if time.monotonic() - renewed > lease_s:
            print(f"no controller renewed the lease for {lease_s:.0f} s: ending", file=sys.stderr)
            return 3


if __name__ == "__main__":
    code = main()
    # Ended as asked (stop key, lease, closed pipe): nothing is left to release. The
    # interpreter's own teardown (torch's modules freed one by one) would take most of a
    # second more, which the controller's close waits for; skip it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
