"""Peer-relative outliers: ranks doing the same work should look the same.

Each step, every watched feature is compared across ranks with a robust z-score
(median/MAD); a rank must stay an outlier for ``persistence`` consecutive steps before it
fires, and must look normal for ``clear`` consecutive steps before it may fire again. When
several ranks of one node go out together, the finding names the node, not the ranks.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from types import MappingProxyType

import numpy as np

from collector.types import Frame, Subject
from detectors._buffer import StepBuffer
from detectors._layout import RankLayout, to_slots
from detectors.stepbatch import StepBatch
from detectors.types import Finding, Severity

#: feature -> (direction, kind[, min_shift]). Direction +1 flags high values, -1 low ones.
#: Memory gets a smaller minimum shift: a leak must be caught while it is still small.
DEFAULT_FEATURES: Mapping[str, tuple[object, ...]] = MappingProxyType(
    {
        "compute_ms": (1, "slow_rank"),
        "data_wait_ms": (1, "dataloader_stall"),
        "comm_ms": (1, "nic_degradation"),
        "nic_gbps": (-1, "nic_degradation"),
        "gpu_temp": (1, "thermal"),
        "sm_clock": (-1, "thermal"),
        "mem_used": (1, "memory_leak", 0.02),
    }
)
#: What a rank-level kind becomes when a whole node (or replica) shows it.
NODE_KINDS: Mapping[str, str] = MappingProxyType({"slow_rank": "slow_node"})
REPLICA_KINDS: Mapping[str, str] = MappingProxyType({"slow_rank": "slow_replica"})
_SAMPLE = 8192  # ranks used to estimate median and MAD; a 1-2 % error at any job size


def _entry(value: Sequence[object]) -> tuple[int, str, float | None]:
    shift = float(value[2]) if len(value) > 2 else None  # type: ignore[arg-type]
    return int(value[0]), str(value[1]), shift  # type: ignore[call-overload]


class PeerOutlier:
    """Flags ranks whose features deviate from their peers at the same step.

    Args:
        features: feature -> (direction, kind[, min_shift]); defaults to DEFAULT_FEATURES.
        z: robust z-score a value must exceed.
        min_shift: relative deviation from the peer median it must also exceed, so a
            tight fleet (tiny MAD) does not fire on harmless differences.
        persistence: consecutive outlier steps before firing.
        clear: consecutive normal steps before a fired rank may fire again.
        min_ranks: peers needed for a comparison.
        node_fraction: share of a node's ranks (and at least two) that makes a node finding.
        replica_fraction: share of a multi-node replica's ranks that makes a replica finding.

    >>> from collector.types import Frame, Subject
    >>> det = PeerOutlier(persistence=1)
    >>> rows = [Frame(Subject(0, r, f"n{r // 4}"), 1, 0.0,
    ...               {"compute_ms": 200.0 if r == 5 else 100.0 + r % 3}) for r in range(8)]
    >>> batch = StepBatch.from_frames(rows)
    >>> [(f.kind, str(f.subject)) for f in det.process_step(batch)]
    [('slow_rank', 'rank 5')]
    """

    name = "peer_outlier"

    def __init__(
        self,
        features: Mapping[str, Sequence[object]] | None = None,
        z: float = 6.0,
        min_shift: float = 0.06,
        persistence: int = 3,
        clear: int = 5,
        min_ranks: int = 4,
        node_fraction: float = 0.5,
        replica_fraction: float = 0.8,
    ) -> None:
        spec = dict(features) if features is not None else dict(DEFAULT_FEATURES)
        self.features = {str(k): _entry(v) for k, v in spec.items()}
        self.z, self.min_shift = z, min_shift
        self.persistence, self.clear = persistence, clear
        self.min_ranks, self.node_fraction = min_ranks, node_fraction
        self.replica_fraction = replica_fraction
        self._names = tuple(self.features)
        self._sign = np.array([self.features[f][0] for f in self._names], dtype=float)
        self._shift = np.array(
            [
                self.features[f][2] if self.features[f][2] is not None else min_shift
                for f in self._names
            ]
        )
        self._layout = RankLayout()
        self._count = np.zeros((0, len(self._names)), dtype=np.int32)
        self._normal = np.zeros((0, len(self._names)), dtype=np.int32)
        self._fired = np.zeros((0, len(self._names)), dtype=bool)
        self._groups_fired: set[tuple[str, int, int]] = set()
        self._buffer = StepBuffer()
        self._rng = np.random.default_rng(0)
        self._sample: np.ndarray | None = None
        self._sample_n = 0

    def process(self, frame: Frame) -> Sequence[Finding]:
        return [f for batch in self._buffer.add(frame) for f in self.process_step(batch)]

    def poll(self, now: float) -> Sequence[Finding]:
        return ()

    def flush(self) -> Sequence[Finding]:
        """Evaluates the step still buffered (at the end of a stream)."""
        return [f for batch in self._buffer.flush() for f in self.process_step(batch)]

    def process_step(self, batch: StepBatch) -> Sequence[Finding]:
        """Compares the ranks of one step and returns the newly confirmed outliers."""
        cols = [batch.features.index(f) if f in batch.features else -1 for f in self._names]
        if all(c < 0 for c in cols) or len(batch.ranks) < self.min_ranks:
            return ()
        if min(cols) >= 0:
            raw = batch.values[:, cols]  # one gather when every feature is reported
        else:
            raw = np.full((len(batch.ranks), len(cols)), np.nan)
            for j, c in enumerate(cols):
                if c >= 0:
                    raw[:, j] = batch.values[:, c]
        if np.isnan(raw).all():  # no rank reported these features here (a wait, a look)
            return ()
        slots = self._layout.rows_to_slots(batch.ranks, batch.nodes, batch.replicas)
        self._grow(len(self._layout.ranks))
        x = to_slots(raw, slots, len(self._layout.ranks))
        med, scale = self._peer_stats(x)
        dev = (x - med) * self._sign
        # One bar per feature: the larger of the z bar and the relative-shift bar.
        bar = np.maximum(self.z * scale, self._shift * np.abs(med))
        with np.errstate(invalid="ignore"):
            out = dev > bar
        self._count += 1
        self._count *= out
        self._normal += 1
        self._normal *= ~out
        self._fired &= self._normal < self.clear
        new = (self._count >= self.persistence) & ~self._fired
        if not new.any():
            return ()
        # Half the bar: a node's other ranks that are drifting out with the first one.
        with np.errstate(invalid="ignore"):
            weak = dev > 0.5 * bar
        return self._findings(new, weak | (self._count > 0), x, med, scale, batch)

    def _peer_stats(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Median and MAD-based scale per feature, from a sample of ranks at large scale."""
        sample = x
        if len(x) > _SAMPLE:
            if self._sample is None or self._sample_n != len(x):
                # A fixed random subset per layout: drawing anew each step costs a shuffle.
                self._sample_n = len(x)
                self._sample = np.sort(self._rng.choice(len(x), _SAMPLE, replace=False))
            sample = x[self._sample]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a feature no rank reported
            med = np.nanmedian(sample, axis=0)
            mad = np.nanmedian(np.abs(sample - med), axis=0)
        scale = np.maximum(1.4826 * mad, 1e-3 * np.abs(med) + 1e-12)
        return med, scale

    def _grow(self, size: int) -> None:
        extra = size - len(self._count)
        if extra > 0:
            pad = ((0, extra), (0, 0))
            self._count = np.pad(self._count, pad)
            self._normal = np.pad(self._normal, pad)
            self._fired = np.pad(self._fired, pad)

    def _findings(
        self,
        new: np.ndarray,
        together: np.ndarray,
        x: np.ndarray,
        med: np.ndarray,
        scale: np.ndarray,
        batch: StepBatch,
    ) -> list[Finding]:
        findings: list[Finding] = []
        lay = self._layout
        for slot, j in zip(*np.nonzero(new), strict=True):
            if self._fired[slot, j]:
                continue  # already reported inside a node or replica finding this step
            # Widest scope first: a replica spanning several nodes, then a node, then a rank.
            scopes = (
                (
                    "replica",
                    lay.replicas,
                    lay.replica_sizes,
                    lay.replica_nodes > 1,
                    self.replica_fraction,
                ),
                ("node", lay.node_ids, lay.node_sizes, lay.nodes != "", self.node_fraction),
            )
            for scope, ids, sizes, eligible, fraction in scopes:
                group = int(ids[slot])
                if not (eligible[group] if scope == "replica" else eligible[slot]):
                    continue
                members = np.flatnonzero(together[:, j] & (ids == group))
                if len(members) >= max(2.0, fraction * sizes[group]):
                    self._fired[members, j] = True
                    if (scope, group, j) not in self._groups_fired:
                        self._groups_fired.add((scope, group, j))
                        findings.append(
                            self._group_finding(scope, members, j, x, med, scale, batch)
                        )
                    break
                self._groups_fired.discard((scope, group, j))
            else:
                self._fired[slot, j] = True
                findings.append(self._rank_finding(int(slot), j, x, med, scale, batch))
        return findings

    def _evidence(
        self, j: int, value: float, med: np.ndarray, scale: np.ndarray
    ) -> dict[str, float]:
        feature = self._names[j]
        return {
            feature: value,
            f"{feature}_peer_median": float(med[j]),
            "robust_z": float((value - med[j]) / scale[j]),
            "relative_shift": float((value - med[j]) / abs(med[j])) if med[j] else 0.0,
        }

    def _rank_finding(
        self, slot: int, j: int, x: np.ndarray, med: np.ndarray, scale: np.ndarray, batch: StepBatch
    ) -> Finding:
        evidence = self._evidence(j, float(x[slot, j]), med, scale)
        lay = self._layout
        subject = Subject(
            int(lay.replicas[slot]), int(lay.ranks[slot]), str(lay.nodes[slot]) or None
        )
        return Finding(
            self.features[self._names[j]][1],
            subject,
            abs(evidence["robust_z"]),
            Severity.WARN,
            batch.time,
            batch.step,
            evidence,
            self.name,
        )

    def _group_finding(
        self,
        scope: str,
        slots: np.ndarray,
        j: int,
        x: np.ndarray,
        med: np.ndarray,
        scale: np.ndarray,
        batch: StepBatch,
    ) -> Finding:
        evidence = self._evidence(j, float(np.nanmedian(x[slots, j])), med, scale)
        evidence["ranks_outlying"] = float(len(slots))
        kind = self.features[self._names[j]][1]
        if scope == "replica":
            subject = Subject(replica=int(self._layout.replicas[slots[0]]))
            kind = REPLICA_KINDS.get(kind, kind)
        else:
            subject = Subject(node=str(self._layout.nodes[slots[0]]))
            kind = NODE_KINDS.get(kind, kind)
        return Finding(
            kind,
            subject,
            abs(evidence["robust_z"]),
            Severity.WARN,
            batch.time,
            batch.step,
            evidence,
            self.name,
        )
