"""Starting and stopping holder processes (one per node; several per host in tests)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import timedelta

import zmq

from ft_runtime._children import die_with_parent
from ft_runtime.ckpt._rpc import Rpc
from ft_runtime.ckpt.config import ENV_CKPT_TOKEN, HolderConfig
from ft_runtime.errors import CheckpointError


def holder_argv(cfg: HolderConfig) -> list[str]:
    """The command line that runs ``cfg``'s holder as its own process."""
    ring = ",".join(f"{n}={ep}" for n, ep in cfg.ring.nodes)
    argv = [
        sys.executable,
        "-m",
        "ft_runtime.ckpt",
        "--job",
        cfg.job,
        "--node",
        cfg.node,
        "--ring",
        ring,
        "--persist-every",
        str(cfg.persist_every),
        "--keep-last",
        str(cfg.keep_last),
        "--keep-in-memory",
        str(cfg.keep_in_memory),
        "--mem-cap-gb",
        str(cfg.mem_cap_bytes / (1 << 30)),
        "--shm-dir",
        cfg.shm_dir,
    ]
    if cfg.storage is not None:
        argv += ["--storage", cfg.storage]
    return argv


class HolderProcess:
    """A holder running as a child process, ready once it answers a ping.

    Args:
        cfg: the holder's configuration.
        timeout: how long :meth:`start` waits for the first answer.
    """

    def __init__(self, cfg: HolderConfig, timeout: timedelta = timedelta(seconds=60)) -> None:
        self.cfg, self.timeout = cfg, timeout
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> HolderProcess:
        """Starts the process and waits until it answers.

        Raises:
            CheckpointError: it exited or did not answer within the timeout.
        """
        return self.launch().wait_ready()

    def launch(self) -> HolderProcess:
        """Starts the process without waiting (start several, then :meth:`wait_ready`)."""
        env = dict(os.environ, OMP_NUM_THREADS="1")
        if self.cfg.token:  # in the environment, not on the command line that ps shows
            env[ENV_CKPT_TOKEN] = self.cfg.token
        # SIGTERM when the job's supervisor dies: a clean stop that deletes the segments
        self.proc = subprocess.Popen(
            holder_argv(self.cfg),
            env=env,
            stdout=subprocess.DEVNULL,
            preexec_fn=die_with_parent(signal.SIGTERM),
        )
        return self

    def wait_ready(self) -> HolderProcess:
        """Waits until the launched process answers a ping.

        Raises:
            CheckpointError: it exited or did not answer within the timeout.
        """
        assert self.proc is not None, "launch() first"
        rpc = Rpc(zmq.Context.instance(), self.cfg.endpoint, 1.0, self.cfg.token)
        deadline = time.monotonic() + self.timeout.total_seconds()
        try:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise CheckpointError(
                        f"holder {self.cfg.node} exited with {self.proc.returncode} at start"
                    )
                try:
                    head, _ = rpc.call({"op": "ping"})
                    if head.get("pid") == self.proc.pid:
                        return self
                except CheckpointError:
                    time.sleep(0.1)
        finally:
            rpc.close()
        self.kill()
        raise CheckpointError(f"holder {self.cfg.node} did not answer within {self.timeout}")

    def kill(self) -> None:
        """SIGKILL: the node is lost (its segments are wiped by the next holder of the node)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        """SIGTERM: a clean shutdown that deletes the node's segments."""
        self.terminate()
        self.wait()

    def terminate(self) -> None:
        """SIGTERM without waiting (stop several at once, then :meth:`wait` for each)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()

    def wait(self) -> None:
        """Waits for the process to exit after :meth:`stop`, killing it after 30 s."""
        if self.proc is not None:
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()

    def __enter__(self) -> HolderProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
