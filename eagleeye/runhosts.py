"""Where a run's ranks and nodes ran: the host of each finding, read back from its store.

`eagleeye run` records its host's name for every (virtual) node in the store's meta
(``hosts``: node -> hostname). Across hosts, `eagleeye controller` records each rank's
launch with its agent's host (events ``rank:R``/``launch`` with ``host``), each node
rank's agent as it joins (``agent:NAME``/``running`` with ``node`` and ``host``), and a
spare that takes a node rank (``job``/``recovering`` with ``node`` and ``host``). A
finding's host is its rank's host at the finding's time, else its node's, else the hosts
of its replica's nodes; a finding on the whole job is the ``job``'s.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from eagleeye.store import RunReader
from ft_runtime.errors import LaunchError
from ft_runtime.layout import JobLayout

#: What a finding on the whole job names as its host.
JOB = "job"
#: What a finding whose host the store does not say names (a store of an older version).
UNKNOWN = "unknown host"


@dataclass(frozen=True, slots=True)
class RunHosts:
    """The hosts of a run's ranks and nodes over time.

    Args:
        nodes: each node's host as the run recorded it once (``eagleeye run``).
        ranks: (time, rank, host) of each rank's launch that named its host.
        changes: (time, node, host) of each node rank's host taking it.
        layout: the run's layout, when the store has it (a rank's node, a replica's).
    """

    nodes: Mapping[str, str]
    ranks: tuple[tuple[float, int, str], ...]
    changes: tuple[tuple[float, str, str], ...]
    layout: JobLayout | None

    @classmethod
    def read(cls, reader: RunReader) -> RunHosts:
        """The hosts recorded in a run's store."""
        meta = reader.meta()
        nodes = meta.get("hosts")
        ranks: list[tuple[float, int, str]] = []
        changes: list[tuple[float, str, str]] = []
        for row in reader.events().to_dict("records"):
            detail, subject = row["detail"], str(row["subject"])
            host = detail.get("host") if isinstance(detail, dict) else None
            if not isinstance(host, str) or not host:
                continue
            time = float(row["time"])
            if subject.startswith("rank:") and row["phase"] == "launch":
                ranks.append((time, int(subject.removeprefix("rank:")), host))
            elif row["phase"] in ("running", "recovering") and isinstance(detail.get("node"), int):
                if detail.get("spare") and row["phase"] == "running":
                    continue  # a spare joining: no node rank yet
                changes.append((time, f"node{detail['node']}", host))
        return cls(
            {str(k): str(v) for k, v in nodes.items()} if isinstance(nodes, dict) else {},
            tuple(sorted(ranks)),
            tuple(sorted(changes)),
            _layout(meta.get("config")),
        )

    def of(self, time: float, rank: int | None, node: str | None) -> str | None:
        """The host of ``rank`` (else of ``node``) at ``time``; None when not recorded."""
        if rank is not None:
            host = _at(time, [(t, h) for t, r, h in self.ranks if r == rank])
            if host is not None:
                return host
            if node is None and self.layout is not None and rank < self.layout.world_size:
                node = self.layout.rank(rank).node
        if node is None:
            return None
        host = _at(time, [(t, h) for t, n, h in self.changes if n == node])
        return host if host is not None else self.nodes.get(node)

    def of_finding(self, finding: Mapping[Any, Any]) -> str:
        """The host of a finding (a row of ``RunReader.findings()``): its rank's or node's;
        a replica's hosts, comma-separated; ``job`` for the whole job's."""
        time = float(finding["time"])
        rank, node = _value(finding.get("rank")), _value(finding.get("node"))
        host = self.of(time, None if rank is None else int(rank), _node(node))
        if host is not None:
            return host
        if finding.get("scope") == "job":
            return JOB
        replica = _value(finding.get("replica"))
        if replica is not None and self.layout is not None:
            hosts = [
                self.of(time, spec.rank, spec.node)
                for spec in self.layout.ranks()
                if spec.replica == int(replica)
            ]
            known = sorted({h for h in hosts if h is not None})
            if known:
                return ",".join(known)
        if node is not None:
            return str(node)  # a host named by its own sources (not one of the job's nodes)
        return UNKNOWN


def _at(time: float, history: list[tuple[float, str]]) -> str | None:
    """The newest host of ``history`` (time order) at ``time``, else its first."""
    if not history:
        return None
    before = [h for t, h in history if t <= time]
    return before[-1] if before else history[0][1]


def _value(value: Any) -> Any:
    """A store's value, None for SQL NULL (NaN or None in a frame)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return value


def _node(node: Any) -> str | None:
    return None if node is None else str(node)


def _layout(config: Any) -> JobLayout | None:
    """The run's layout from its config meta (None when the store does not have it)."""
    if not isinstance(config, dict):
        return None
    try:
        return JobLayout(
            int(config["nnodes"]),
            int(config["nproc_per_node"]),
            int(config.get("replicas", 1)),
        )
    except (KeyError, TypeError, ValueError, LaunchError):
        return None


__all__ = ["JOB", "UNKNOWN", "RunHosts"]
