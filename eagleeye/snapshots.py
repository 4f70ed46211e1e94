"""In-memory snapshots for `eagleeye run`: one holder per node, and each rank's client.

With ``JobConfig(snapshots=True)`` the launcher starts a snapshot holder process per
(virtual) node before the ranks and stops them at the end; they outlive every restart of
the ranks. A rank's :class:`~eagleeye.session.RankSession` then saves its checkpoints into
its node's holder (a memory copy; backup to the next node and persistence to the run's
``snapshots`` folder run in the holder) and restores memory first, then from the
neighbour node, then from storage. Every restore is reported as an ``event.restore`` with
the tier it came from and its time.

The ranks of a node hold the same state (data parallel), so each snapshots its
``1/nproc_per_node`` share and a restore reassembles the whole from the node's holder.

Holders answer only requests that carry the job's secret (handed to holders and ranks in
their environment). A holder that dies is started again (it wipes its node's segments and
pulls its snapshots back from the next node's backups); meanwhile its ranks' saves fail
at once rather than wait for it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import threading
import time
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import zmq

from ft_runtime.ckpt import (
    ENV_CKPT_TOKEN,
    ClientConfig,
    HolderConfig,
    HolderProcess,
    Ring,
    shm_dir_from,
)
from ft_runtime.ckpt._rpc import Rpc
from ft_runtime.ckpt.config import parse_ring, ring_text
from ft_runtime.layout import ENV_SNAPSHOT_RING, ENV_SNAPSHOT_STORAGE, JobLayout
from ft_runtime.ports import free_port

if TYPE_CHECKING:
    from ft_runtime.ckpt import CheckpointClient

log = logging.getLogger(__name__)
_NICE = 10


@dataclass(frozen=True, slots=True)
class Restored:
    """A restored state, with where it came from and how long the restore took."""

    step: int
    state: dict[str, Any]
    tier: str
    seconds: float


@dataclass(frozen=True, slots=True)
class Snapshotted:
    """One save into the holder: the time training was blocked for the copy."""

    step: int
    ok: bool
    seconds: float
    nbytes: int
    error: str = ""


class RankSnapshots:
    """One rank's saves and restores through its node's holder."""

    def __init__(self, client: CheckpointClient) -> None:
        self.client = client

    @classmethod
    def from_env(
        cls, env: Mapping[str, str], node: str, local_rank: int, nproc_per_node: int
    ) -> RankSnapshots | None:
        text = env.get(ENV_SNAPSHOT_RING)
        if not text:
            return None
        cfg = ClientConfig(
            node,
            parse_ring(text),
            dp_rank=local_rank,
            dp_size=nproc_per_node,
            storage=env.get(ENV_SNAPSHOT_STORAGE) or None,
            token=env.get(ENV_CKPT_TOKEN, ""),
        )
        from ft_runtime.ckpt import CheckpointClient  # torch: only where ranks save

        return cls(CheckpointClient(cfg))

    def save(self, state: Mapping[str, Any], step: int) -> Snapshotted:
        """Copies the state into the holder (blocks only for the copy); never raises for a
        holder that is gone or full (``ok=False`` then)."""
        result = self.client.save(dict(state), step)
        return Snapshotted(step, result.ok, result.blocking_s, result.nbytes, result.error)

    def load(self) -> Restored | None:
        """The newest complete snapshot from the fastest tier that has it, or None."""
        t0 = time.perf_counter()
        got = self.client.load()
        if got is None:
            return None
        return Restored(got.step, dict(got.state), got.tier.value, time.perf_counter() - t0)

    def close(self) -> None:
        self.client.close()


class Holders:
    """The job's holders, one per node of ``layout``, as child processes.

    Use as a context manager around the job; :attr:`env` is what the ranks need.

    On one machine every node's holder runs here, on ports of ``host``. Across hosts each
    agent runs its own node's (``local``) in the ``ring`` the controller gave every host,
    with the job's ``token``: its backups go to the next node's holder, on another host.
    """

    def __init__(
        self,
        layout: JobLayout,
        job: str,
        storage: Path,
        host: str = "127.0.0.1",
        max_restarts: int = 5,
        watch_s: float = 0.5,
        *,
        ring: Ring | None = None,
        token: str | None = None,
        local: Sequence[str] | None = None,
    ):
        self.token = token or secrets.token_hex(16)
        self.max_restarts, self.watch_s = max_restarts, watch_s
        self.restarts = 0
        self._stopping = threading.Event()
        self._watcher: threading.Thread | None = None
        nodes = [f"node{i}" for i in range(layout.nnodes)]
        self.ring = ring or Ring(tuple((n, f"tcp://{host}:{free_port(host)}") for n in nodes))
        self.storage = storage
        here = [n for n, _ in self.ring.nodes] if local is None else list(local)
        self.configs = [
            HolderConfig(
                _job_name(job),
                n,
                self.ring,
                storage=str(storage),
                persist_every=1,
                keep_last=2,
                shm_dir=shm_dir_from(os.environ),
                token=self.token,
            )
            for n in here
        ]
        self.processes: list[HolderProcess] = []

    @property
    def env(self) -> dict[str, str]:
        return {
            ENV_SNAPSHOT_RING: ring_text(self.ring),
            ENV_SNAPSHOT_STORAGE: str(self.storage),
            ENV_CKPT_TOKEN: self.token,
        }

    def replace_ring(self, ring: Ring) -> None:
        """Tells every running holder here the job's new ring (a spare host took a node's
        place; the nodes here keep their endpoints): their backups go to their new next
        node from now on, and nothing they hold is dropped. A holder started again later
        starts in the new ring.

        Raises:
            CheckpointError: a holder refused the ring or did not answer.
        """
        self.ring = ring
        self.configs = [dataclasses.replace(c, ring=ring) for c in self.configs]
        text = ring_text(ring)
        for i, p in enumerate(self.processes):
            p.cfg = self.configs[i]
            rpc = Rpc(zmq.Context.instance(), p.cfg.endpoint, 10.0, self.token)
            try:
                rpc.call({"op": "ring", "ring": text})
            finally:
                rpc.close()

    def __enter__(self) -> Holders:
        self.processes = [_launch(c) for c in self.configs]
        try:
            for p in self.processes:
                p.wait_ready()
        except BaseException:
            self._stop_all()
            raise
        self._watcher = threading.Thread(target=self._watch, name="holders", daemon=True)
        self._watcher.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop_all()

    def _stop_all(self) -> None:
        self._stopping.set()
        if self._watcher is not None:
            self._watcher.join()
        try:
            with ExitStack() as stack:
                for p in self.processes:
                    stack.callback(p.wait)
                for p in self.processes:  # all at once: each one's stop takes a while
                    p.terminate()
        finally:
            self._remove_segments()

    def _remove_segments(self) -> None:
        """Once every holder has exited: segments of the job that one left behind (a
        holder SIGKILLed, or killed after it did not stop in time, deletes nothing)."""
        for cfg in self.configs:
            for path in Path(cfg.shm_dir).glob(f"eeckpt.{cfg.job}.{cfg.node}.*"):
                try:
                    path.unlink(missing_ok=True)
                except OSError as exc:
                    log.warning("could not remove the snapshot segment %s: %s", path, exc)

    def _watch(self) -> None:
        """Starts again every holder that exited, up to ``max_restarts`` in all."""
        while not self._stopping.wait(self.watch_s):
            for i, p in enumerate(self.processes):
                if p.proc is None or p.proc.poll() is None or self._stopping.is_set():
                    continue
                if self.restarts >= self.max_restarts:
                    continue
                self.restarts += 1
                log.warning(
                    "snapshot holder of %s exited with %s; starting it again (%d of %d)",
                    p.cfg.node,
                    p.proc.returncode,
                    self.restarts,
                    self.max_restarts,
                )
                try:
                    self.processes[i] = _launch(p.cfg).wait_ready()
                except Exception:
                    log.exception("snapshot holder of %s did not start again", p.cfg.node)


def _launch(cfg: HolderConfig) -> HolderProcess:
    process = HolderProcess(cfg).launch()
    if process.proc is not None:
        # backup and persistence run at a lower priority than the ranks' training
        os.setpriority(os.PRIO_PROCESS, process.proc.pid, _NICE)
    return process


def _job_name(run_id: str) -> str:
    # segment names allow letters, digits, '_' and '-' (at most 64)
    cleaned = "".join(c if c.isalnum() or c in "_-" else "-" for c in run_id)
    return cleaned[-64:] or "job"
