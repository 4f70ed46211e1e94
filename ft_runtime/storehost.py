"""The quorum's key-value store in a process of its own, so that the coordinator can restart.

Ranks read memberships, write heartbeats and set up their cross-replica groups through one
``TCPStore``. Hosted by the coordinator, it would vanish with it and take every rank's
connection along; hosted here, a coordinator can stop and a new one connect to the same
address and resume from its log (``ft_runtime.quorum``). The process prints its port on
its first line and exits when its parent closes its stdin (or dies), so it never outlives
the job's supervisor.

    python -m ft_runtime.storehost --host 127.0.0.1
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from datetime import timedelta

from ft_runtime.errors import LaunchError


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ft_runtime.storehost")
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args(argv)
    from ft_runtime import _dist as dist

    store = dist.TCPStore(
        args.host, 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30)
    )
    print(store.port, flush=True)
    sys.stdin.buffer.read()  # returns when the parent closes the pipe or dies
    return 0


if __name__ == "__main__":
    sys.exit(main())
