"""Findings from a peer comparison: one per rank, or one per node or replica gone out together.

Several ranks of one node (or most ranks of a multi-node replica) out at once are one
fault of that node (or replica), not several of ranks: the widest such group is named.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from collector.types import Subject
from detectors._peercore import Comparison, PeerCore
from detectors.stepbatch import StepBatch
from detectors.types import Finding, Severity


class GroupFindings:
    """Turns a comparison's newly confirmed cells into findings.

    Args:
        core: the comparison's state (its layout and fired cells are read and updated).
        kind_of: the finding kind of a feature column.
        name: the detector name the findings carry.
        node_kinds, replica_kinds: what a rank kind becomes for a whole node or replica.
        node_fraction: share of a node's ranks (and at least two) that makes a node finding.
        replica_fraction: share of a multi-node replica's ranks that makes a replica finding.
        explained_by: rank kind -> kinds that, already fired on the same rank, explain it
            (no second finding).
    """

    def __init__(
        self,
        core: PeerCore,
        kind_of: Callable[[int], str],
        name: str,
        node_kinds: Mapping[str, str],
        replica_kinds: Mapping[str, str],
        node_fraction: float,
        replica_fraction: float,
        explained_by: Mapping[str, frozenset[str]] | None = None,
    ) -> None:
        self.core, self.kind_of, self.name = core, kind_of, name
        self.explained_by = dict(explained_by or {})
        self.node_kinds, self.replica_kinds = dict(node_kinds), dict(replica_kinds)
        self.node_fraction, self.replica_fraction = node_fraction, replica_fraction
        self._groups_fired: set[tuple[str, int, int]] = set()

    def findings(self, cmp: Comparison, batch: StepBatch) -> list[Finding]:
        out: list[Finding] = []
        fired = self.core.fired
        for slot, j in zip(*np.nonzero(cmp.new), strict=True):
            if fired[slot, j]:
                continue  # already reported inside a node or replica finding this step
            group = self._group(int(slot), int(j), cmp)
            if group is None:
                fired[slot, j] = True
                if not self._explained(int(slot), int(j)):
                    out.append(self._finding(self._rank(int(slot)), [int(slot)], j, cmp, batch))
                continue
            scope, members, key = group
            fired[members, j] = True
            if key not in self._groups_fired:
                self._groups_fired.add(key)
                out.append(self._finding(scope, list(members), j, cmp, batch))
        return out

    def _explained(self, slot: int, j: int) -> bool:
        """Whether a fired cell of a kind that explains column ``j``'s is on the slot."""
        causes = self.explained_by.get(self.kind_of(j))
        if not causes:
            return False
        fired = self.core.fired[slot]
        return any(fired[k] and self.kind_of(k) in causes for k in range(len(fired)))

    def _group(
        self, slot: int, j: int, cmp: Comparison
    ) -> tuple[Subject, np.ndarray, tuple[str, int, int]] | None:
        """The widest group (replica, then node) the slot went out with, if any."""
        lay = self.core.layout
        scopes = (
            ("replica", lay.replicas, lay.replica_sizes, self.replica_fraction),
            ("node", lay.node_ids, lay.node_sizes, self.node_fraction),
        )
        for scope, ids, sizes, fraction in scopes:
            group = int(ids[slot])
            eligible = lay.replica_nodes[group] > 1 if scope == "replica" else lay.nodes[slot] != ""
            if not eligible:
                continue
            members = np.flatnonzero(cmp.together[:, j] & (ids == group))
            key = (scope, group, j)
            if len(members) >= max(2.0, fraction * sizes[group]):
                first = int(members[0])
                if scope == "replica":
                    return Subject(replica=int(lay.replicas[first])), members, key
                return Subject(node=str(lay.nodes[first])), members, key
            self._groups_fired.discard(key)
        return None

    def _rank(self, slot: int) -> Subject:
        lay = self.core.layout
        node = str(lay.nodes[slot]) or None
        return Subject(int(lay.replicas[slot]), int(lay.ranks[slot]), node)

    def _finding(
        self, subject: Subject, slots: list[int], j: int, cmp: Comparison, batch: StepBatch
    ) -> Finding:
        feature = self.core.names[j]
        value = float(np.nanmedian(cmp.x[slots, j]))  # the rank's usual offset divided out
        own = float(np.median(self.core.offsets.factor[slots, j]))
        med, scale = float(cmp.med[j]), float(cmp.scale[j])
        evidence = {
            feature: value * own,
            f"{feature}_peer_median": med,
            f"{feature}_usual_ratio": own,
            "robust_z": (value - med) / scale,
            "relative_shift": (value - med) / abs(med) if med else 0.0,
        }
        if len(slots) > 1:
            evidence["ranks_outlying"] = float(len(slots))
        kind = self.kind_of(j)
        if subject.scope == "replica":
            kind = self.replica_kinds.get(kind, kind)
        elif subject.scope == "node":
            kind = self.node_kinds.get(kind, kind)
        score = abs(evidence["robust_z"])
        return Finding(
            kind, subject, score, Severity.WARN, batch.time, batch.step, evidence, self.name
        )
