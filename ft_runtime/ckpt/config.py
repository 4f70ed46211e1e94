"""Configuration of the snapshot holder and the checkpoint client.

Constructors do no work; relationships between values are checked once in
``__post_init__``. Environment variables (read only by the holder's command line and, through
:func:`shm_dir_from`, the composition root; never deep in the library) carry the prefix
``EE_CKPT_``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta

from ft_runtime.errors import CheckpointError

ENV_SHM_DIR = "EE_CKPT_SHM_DIR"
"""Directory of the shared-memory segments (default ``/dev/shm``)."""

DEFAULT_SHM_DIR = "/dev/shm"


def shm_dir_from(env: Mapping[str, str]) -> str:
    """The segments' directory ``env`` names with :data:`ENV_SHM_DIR`, else the default.

    >>> shm_dir_from({}), shm_dir_from({ENV_SHM_DIR: "/mnt/snapshots"})
    ('/dev/shm', '/mnt/snapshots')
    """
    return env.get(ENV_SHM_DIR, DEFAULT_SHM_DIR)


ENV_CKPT_TOKEN = "EE_CKPT_TOKEN"
"""The job's secret: a holder with one answers only requests that carry it (unset: any)."""
ENV_MEM_CAP_GB = "EE_CKPT_MEM_CAP_GB"
"""Memory cap of one holder in GiB (local snapshots plus backups of the previous node)."""

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def _check_name(what: str, value: str) -> None:
    if not _NAME.match(value):
        raise CheckpointError(
            f"{what} {value!r} is not a valid name: use 1-64 letters, digits, '_' or '-'"
        )


@dataclass(frozen=True, slots=True)
class Ring:
    """The holders of a job in ring order: node ``i`` backs up to node ``i + 1``.

    Args:
        nodes: ``(node_id, zmq endpoint)`` pairs, e.g. ``("node0", "tcp://127.0.0.1:5600")``.
    """

    nodes: tuple[tuple[str, str], ...]

    def __post_init__(self) -> None:
        if not self.nodes:
            raise CheckpointError("a ring needs at least one (node_id, endpoint) pair")
        ids = [n for n, _ in self.nodes]
        if len(set(ids)) != len(ids):
            raise CheckpointError(f"node ids in a ring must be unique, got {ids}")
        for node, _ in self.nodes:
            _check_name("node id", node)

    def index(self, node: str) -> int:
        for i, (n, _) in enumerate(self.nodes):
            if n == node:
                return i
        raise CheckpointError(f"node {node!r} is not in the ring {[n for n, _ in self.nodes]}")

    def endpoint(self, node: str) -> str:
        return self.nodes[self.index(node)][1]

    def next(self, node: str) -> tuple[str, str] | None:
        """The node this one backs up to, or None in a ring of one."""
        if len(self.nodes) == 1:
            return None
        return self.nodes[(self.index(node) + 1) % len(self.nodes)]

    def prev(self, node: str) -> tuple[str, str] | None:
        """The node that backs up to this one, or None in a ring of one."""
        if len(self.nodes) == 1:
            return None
        return self.nodes[(self.index(node) - 1) % len(self.nodes)]


def ring_text(ring: Ring) -> str:
    """The ring as ``node0=tcp://host:port,node1=...`` (what :func:`parse_ring` reads)."""
    return ",".join(f"{node}={endpoint}" for node, endpoint in ring.nodes)


def parse_ring(text: str) -> Ring:
    """The ring written by :func:`ring_text`.

    Raises:
        ValueError: the text is not ``node=endpoint`` pairs separated by commas.
    """
    pairs = [p.split("=", 1) for p in text.split(",") if p]
    if not pairs or any(len(p) != 2 for p in pairs):
        raise ValueError(f"ring {text!r}: expected node=endpoint pairs separated by commas")
    return Ring(tuple((a, b) for a, b in pairs))


@dataclass(frozen=True, slots=True)
class HolderConfig:
    """One node's snapshot holder.

    Args:
        job: namespace of the shared-memory segments, so jobs on one host never collide.
        node: this node's id in ``ring``.
        ring: every holder of the job.
        storage: directory or fsspec URL for persistence; None keeps snapshots in memory only.
        persist_every: persist steps that are multiples of this (1 = every snapshot).
        keep_last: persisted checkpoints kept per shard (retention).
        keep_in_memory: complete iterations kept in memory per shard before eviction.
        mem_cap_bytes: cap on all segments this holder owns; oldest iterations are evicted
            first and a save that still does not fit fails cleanly.
        shm_dir: where segments live (a tmpfs).
        token: the job's secret; requests without it are refused ("" accepts any).
    """

    job: str
    node: str
    ring: Ring
    storage: str | None = None
    persist_every: int = 1
    keep_last: int = 2
    keep_in_memory: int = 2
    mem_cap_bytes: int = 16 << 30
    shm_dir: str = DEFAULT_SHM_DIR
    chunk_bytes: int = 64 << 20
    token: str = field(default="", repr=False)

    def __post_init__(self) -> None:
        _check_name("job", self.job)
        self.ring.index(self.node)
        if self.persist_every < 1 or self.keep_last < 1 or self.keep_in_memory < 1:
            raise CheckpointError("persist_every, keep_last and keep_in_memory must be >= 1")
        if self.mem_cap_bytes <= 0 or self.chunk_bytes <= 0:
            raise CheckpointError("mem_cap_bytes and chunk_bytes must be positive")

    @property
    def endpoint(self) -> str:
        return self.ring.endpoint(self.node)


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """One trainer rank's view of the checkpoint engine.

    Args:
        node: the node this rank runs on (its holder is the local memory tier).
        ring: every holder of the job (peers are the second tier).
        dp_rank: this rank's index among ``dp_size`` data-parallel replicas holding identical
            state; it snapshots the ``dp_rank``-th 1/``dp_size`` of every tensor.
        storage: the holders' storage, read as the last tier; None skips it.
        timeout: how long one request to a holder may take before it counts as gone.
        token: the job's secret, sent with every request to a holder.
    """

    node: str
    ring: Ring
    dp_rank: int = 0
    dp_size: int = 1
    storage: str | None = None
    timeout: timedelta = timedelta(seconds=5)
    token: str = field(default="", repr=False)

    def __post_init__(self) -> None:
        self.ring.index(self.node)
        if not 0 <= self.dp_rank < self.dp_size:
            raise CheckpointError(
                f"dp_rank must be in [0, dp_size): got dp_rank={self.dp_rank}, "
                f"dp_size={self.dp_size}"
            )
        if self.timeout <= timedelta(0):
            raise CheckpointError("timeout must be positive")
