"""A host's snapshot holder in a job across hosts.

Each agent declares, in its hello, where its holder will listen (``holder_endpoint``: its
advertised address and a port). With snapshots on, the controller puts the ring of every
host's holder in the launch (``ring_of``), node rank order; on its first launch the agent
starts its own node's holder in that ring (``HostHolder``), with the token derived from
the job's secret, and hands its ranks the ring: a rank saves into its host's holder, which
backs up to the next node's holder, on another host, and persists to this host's disk.
The holder outlives the job's restarts, and is started again if it dies.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from pathlib import Path

from eagleeye.errors import EagleEyeError
from eagleeye.snapshots import Holders
from ft_runtime.ckpt.config import parse_ring
from ft_runtime.errors import CheckpointError
from ft_runtime.layout import JobLayout


def holder_endpoint(advertise: str, port: int = 0) -> str:
    """Where this host's holder listens: its advertised address (resolved: a holder binds
    to an address, not a name) and ``port`` (0: a free one)."""
    try:
        address = socket.gethostbyname(advertise)
    except OSError as exc:
        raise EagleEyeError(
            f"--advertise {advertise!r} does not resolve ({exc}); give this host's address"
        ) from None
    if port == 0:
        with socket.socket() as probe:
            probe.bind((address, 0))
            port = int(probe.getsockname()[1])
    return f"tcp://{address}:{port}"


def ring_of(endpoints: Mapping[int, str]) -> str:
    """The ring text of every node rank's holder endpoint, node rank order.

    Raises:
        EagleEyeError: a node rank declared no holder (an agent too old for snapshots).
    """
    missing = [n for n, e in sorted(endpoints.items()) if not e]
    if missing:
        raise EagleEyeError(
            f"--snapshots: the agents of node ranks {missing} declared no snapshot holder "
            "(their --advertise address did not resolve, or they run an older eagleeye); "
            "give each agent its address with --advertise, or drop --snapshots"
        )
    return ",".join(f"node{n}={endpoints[n]}" for n in sorted(endpoints))


class HostHolder:
    """This host's node's holder in the controller's ring (a context manager).

    Args:
        ring: the ring text from the launch.
        node_rank: this host's node rank.
        declared: the endpoint this agent declared for its holder.
        job: the job's id (names the holder's segments).
        storage: where the holder persists snapshots on this host.
        token: the job's holder token.
        layout: the job's layout.

    Raises:
        EagleEyeError: the ring is malformed or names another endpoint for this node.
    """

    def __init__(
        self,
        ring: str,
        node_rank: int,
        declared: str,
        job: str,
        storage: Path,
        token: str,
        layout: JobLayout,
    ) -> None:
        node = f"node{node_rank}"
        try:
            parsed = parse_ring(ring)
        except (ValueError, CheckpointError) as exc:
            raise EagleEyeError(f"the controller's snapshot ring is malformed: {exc}") from None
        mine = dict(parsed.nodes).get(node)
        if mine != declared:
            raise EagleEyeError(
                f"the controller's snapshot ring names {mine!r} for {node}, this agent "
                f"declared {declared!r}"
            )
        self.holders = Holders(layout, job, storage, ring=parsed, token=token, local=[node])

    @property
    def env(self) -> dict[str, str]:
        """What this host's ranks need to save into it."""
        return self.holders.env

    def __enter__(self) -> HostHolder:
        self.holders.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.holders.__exit__(*exc)


__all__ = ["HostHolder", "holder_endpoint", "ring_of"]
