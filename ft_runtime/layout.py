"""Where each rank of a job sits: its node, its replica, and the environment it gets.

The world is ``nnodes × nproc_per_node`` ranks, split into ``replicas`` data-parallel
replicas of consecutive ranks. Ranks get torchrun's environment variables, so a script that
runs under torchrun runs here unchanged, plus Eagle Eye's own (prefixed ``EAGLEEYE_``).

>>> layout = JobLayout(nnodes=2, nproc_per_node=2, replicas=2)
>>> [(r.rank, r.node, r.replica, r.replica_rank) for r in layout.ranks()]
[(0, 'node0', 0, 0), (1, 'node0', 0, 1), (2, 'node1', 1, 0), (3, 'node1', 1, 1)]
"""

from __future__ import annotations

from dataclasses import dataclass

from ft_runtime.errors import LaunchError

ENV_REPLICA = "EAGLEEYE_REPLICA"
"""Index of the rank's data-parallel replica."""
ENV_NUM_REPLICAS = "EAGLEEYE_NUM_REPLICAS"
ENV_REPLICA_RANK = "EAGLEEYE_REPLICA_RANK"
"""The rank's index inside its replica."""
ENV_REPLICA_SIZE = "EAGLEEYE_REPLICA_SIZE"
ENV_NODE = "EAGLEEYE_NODE"
"""Id of the (possibly virtual) node the rank runs on."""
ENV_CATCHUP_TOKEN = "EAGLEEYE_CATCHUP_TOKEN"
"""Bearer token the ranks of a run require from each other for catch-up transfers."""
ENV_CATCHUP_HOST = "EAGLEEYE_CATCHUP_HOST"
"""The address a rank's catch-up server binds and its peers reach it at (loopback when
unset; a host's own address when replicas span hosts)."""
ENV_SERVE_NICE = "EAGLEEYE_SERVE_NICE"
"""Nice levels below the training thread at which a rank's catch-up server threads run."""
ENV_SNAPSHOT_RING = "EAGLEEYE_SNAPSHOT_RING"
"""The job's snapshot holders as ``node0=tcp://host:port,node1=...``; unset: no snapshots."""
ENV_SNAPSHOT_STORAGE = "EAGLEEYE_SNAPSHOT_STORAGE"
"""Where the holders persist snapshots (the last restore tier)."""
ENV_ATTEMPT = "TORCHELASTIC_RESTART_COUNT"
"""Restart attempt, as torchrun names it; scripts use it to prefix store keys."""
ENV_RESUME_FROM = "EAGLEEYE_RESUME_FROM"
"""On a restart: the newest complete checkpoint Eagle Eye knows (unset when none)."""


@dataclass(frozen=True, slots=True)
class RankSpec:
    rank: int
    local_rank: int
    node_rank: int
    node: str
    replica: int
    replica_rank: int


@dataclass(frozen=True, slots=True)
class JobLayout:
    nnodes: int = 1
    nproc_per_node: int = 1
    replicas: int = 1

    def __post_init__(self) -> None:
        if self.nnodes < 1 or self.nproc_per_node < 1 or self.replicas < 1:
            raise LaunchError("nnodes, nproc-per-node and replicas must all be at least 1")
        if self.world_size % self.replicas:
            raise LaunchError(
                f"{self.world_size} ranks ({self.nnodes} nodes × {self.nproc_per_node}) "
                f"cannot be split into {self.replicas} equal replicas; choose a divisor"
            )

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    @property
    def replica_size(self) -> int:
        return self.world_size // self.replicas

    def rank(self, rank: int) -> RankSpec:
        node_rank, local_rank = divmod(rank, self.nproc_per_node)
        replica, replica_rank = divmod(rank, self.replica_size)
        return RankSpec(rank, local_rank, node_rank, f"node{node_rank}", replica, replica_rank)

    def ranks(self) -> list[RankSpec]:
        return [self.rank(r) for r in range(self.world_size)]

    def environment(
        self, spec: RankSpec, master_addr: str, master_port: int, attempt: int, run_id: str
    ) -> dict[str, str]:
        """The variables a rank is started with (torchrun's, then Eagle Eye's)."""
        return {
            "RANK": str(spec.rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(spec.local_rank),
            "LOCAL_WORLD_SIZE": str(self.nproc_per_node),
            "GROUP_RANK": str(spec.node_rank),
            "ROLE_RANK": str(spec.rank),
            "ROLE_WORLD_SIZE": str(self.world_size),
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(master_port),
            "GROUP_WORLD_SIZE": str(self.nnodes),
            "ROLE_NAME": "default",
            "TORCHELASTIC_RUN_ID": run_id,
            "TORCHELASTIC_USE_AGENT_STORE": "False",
            ENV_ATTEMPT: str(attempt),
            ENV_REPLICA: str(spec.replica),
            ENV_NUM_REPLICAS: str(self.replicas),
            ENV_REPLICA_RANK: str(spec.replica_rank),
            ENV_REPLICA_SIZE: str(self.replica_size),
            ENV_NODE: spec.node,
        }
