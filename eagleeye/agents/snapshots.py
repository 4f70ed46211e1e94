"""A host's snapshot holder in a job across hosts.

Each agent declares, in its hello, where its holder will listen (``holder_endpoint``: its
advertised address and a port). With snapshots on, the controller puts the ring of every
host's holder in the launch (``ring_of``), node rank order; on its first launch the agent
starts its own node's holder in that ring (``HostHolder``), with the token derived from
the job's secret, and hands its ranks the ring: a rank saves into its host's holder, which
backs up to the next node's holder, on another host, and persists to this host's disk.
The holder outlives the job's restarts, and is started again if it dies. When a spare
host takes node rank ``n``, its holder takes node ``n``'s place in the ring of the
restart: the spare's agent starts it (it pulls node ``n``'s snapshots back from the next
node's backups), and every other agent tells its running holder the new ring
(``HostHolder.update``), which keeps its memory and backs up to its new next node.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from pathlib import Path

from eagleeye.errors import EagleEyeError
from eagleeye.snapshots import Holders
from ft_runtime.ckpt.config import Ring, parse_ring
from ft_runtime.errors import CheckpointError
from ft_runtime.layout import JobLayout
from ft_runtime.ports import free_port


def holder_endpoint(advertise: str, port: int = 0) -> str:
    """Where this host's holder listens: its advertised address (resolved: a holder binds
    to an address, not a name) and ``port`` (0: a free one)."""
    try:
        address = socket.gethostbyname(advertise)
    except OSError as exc:
        raise EagleEyeError(
            f"--advertise {advertise!r} does not resolve ({exc}); give this host's address"
        ) from None
    return f"tcp://{address}:{port or free_port(address)}"


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
        self.node, self.declared = f"node{node_rank}", declared
        self.text = ring
        parsed = self._parse(ring)
        self.holders = Holders(layout, job, storage, ring=parsed, token=token, local=[self.node])

    def _parse(self, ring: str) -> Ring:
        try:
            parsed = parse_ring(ring)
        except (ValueError, CheckpointError) as exc:
            raise EagleEyeError(f"the controller's snapshot ring is malformed: {exc}") from None
        mine = dict(parsed.nodes).get(self.node)
        if mine != self.declared:
            raise EagleEyeError(
                f"the controller's snapshot ring names {mine!r} for {self.node}, this agent "
                f"declared {self.declared!r}"
            )
        return parsed

    def update(self, ring: str) -> bool:
        """The controller's ring of a later launch: when a spare host took another node's
        place, this host's holder is told the new ring (its memory kept, its backups sent
        to the new next host). Returns whether the ring changed.

        Raises:
            EagleEyeError: the ring is malformed, moves this node, or the holder refused it.
        """
        if ring == self.text:
            return False
        parsed = self._parse(ring)
        try:
            self.holders.replace_ring(parsed)
        except CheckpointError as exc:
            why = f"this host's snapshot holder refused the new ring: {exc}"
            raise EagleEyeError(why) from None
        self.text = ring
        return True

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
