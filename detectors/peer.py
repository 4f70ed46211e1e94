"""Peer-relative outliers: ranks doing the same work should look the same.

Each step, every watched feature of every rank is compared with its peers (see
detectors._peercore): after the rank's own stable offset is divided out, so a GPU that is
always 3 % slower is no outlier and one that became 10 % slower is; against bars of
robust z, relative shift and an absolute floor; held for ``persistence`` reports. When
several ranks of one node go out together, the finding names the node, not the ranks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from collector.vocabulary import canonical_name
from detectors._buffer import Stepwise
from detectors._peercore import PeerCore
from detectors._peergroups import GroupFindings
from detectors.errors import DetectorError
from detectors.fusion import EXPLAINED_BY
from detectors.stepbatch import StepBatch
from detectors.types import Finding


@dataclass(frozen=True)
class PeerFeature:
    """How one feature is compared: ``direction`` +1 (high is bad), -1 (low is bad) or 0
    (either), the finding ``kind``, its own ``min_shift`` (None: the detector's), an
    absolute floor ``min_abs`` in the feature's unit, whether the rank's stable ``offset``
    is removed, how many of the last five reports must beat the bar (``votes``: noisy
    timings need three, a clean flag one), its own ``persistence`` (None: the
    detector's), the share of the job's median step an excess time must also reach
    (``step_share``; a time in milliseconds), and another feature in the same unit whose
    deficit under its peers is taken from the value before it is compared (``net_of``)."""

    direction: int
    kind: str
    min_shift: float | None = None
    min_abs: float = 0.0
    offset: bool = True
    votes: int = 3
    persistence: int | None = None
    step_share: float = 0.0
    net_of: str | None = None

    @classmethod
    def parse(cls, name: str, spec: object) -> PeerFeature:
        """From a PeerFeature, a mapping of its fields, or ``(direction, kind[, min_shift])``."""
        if isinstance(spec, PeerFeature):
            return spec
        try:
            if isinstance(spec, Mapping):
                return cls(**spec)
            return cls(*spec)  # type: ignore[misc]
        except TypeError as exc:
            raise DetectorError(f"bad peer feature {name!r}: {spec!r} ({exc})") from None


_ERRORS = PeerFeature(1, "nic_degradation", 0.0, 1.0, offset=False)  # errors a second
#: The features compared by default. Times need 5 ms of excess at least (a data wait of
#: 2 ms against 0.5 ms is four times its peers' and costs nothing), and a data wait 2 % of
#: the job's step (50 ms on a 2.5 s step: a loader hiccup of a few tens of milliseconds
#: that a rank's usual wait doubles is no stall worth a look), a temperature 5 °C (a
#: GPU usually cooler than its peers that warms to within a few degrees of them is not
#: overheating). Memory gets a smaller minimum shift: a leak must be caught while it is
#: still small. Flags and error rates idle at 0: they need no offset, and an absolute
#: floor says how much is a fault (one thermal flag; an error a second). A GPU's
#: temperature is scraped less often than steps are reported and is smooth: fewer of its
#: reports must agree. A collective time keeps no offset (its wait is the slower ranks'
#: compute less the rank's own, a difference, not a ratio) and counts net of the rank's
#: compute deficit: a faster GPU waits longer in every all-reduce, by what it saved.
DEFAULT_FEATURES: Mapping[str, PeerFeature] = MappingProxyType(
    {
        "compute_ms": PeerFeature(1, "slow_rank", min_abs=5.0),
        "data_wait_ms": PeerFeature(1, "dataloader_stall", min_abs=5.0, step_share=0.02),
        "comm_ms": PeerFeature(
            1, "nic_degradation", min_abs=5.0, offset=False, net_of="compute_ms"
        ),
        "nic_gbps": PeerFeature(-1, "nic_degradation"),
        "gpu_temp": PeerFeature(1, "thermal", min_abs=5.0, votes=2),
        "sm_clock": PeerFeature(-1, "thermal"),  # healthy power-brake dips come and go
        "throttle_thermal": PeerFeature(1, "thermal", 0.0, 0.5, offset=False, votes=1),
        "mem_used": PeerFeature(1, "memory_leak", 0.02),
        "nic_rx_errors_rate": _ERRORS,
        "nic_tx_errors_rate": _ERRORS,
        "nic_rx_drops_rate": _ERRORS,
        "nic_tx_drops_rate": _ERRORS,
    }
)
#: What a rank-level kind becomes when a whole node (or replica) shows it.
NODE_KINDS: Mapping[str, str] = MappingProxyType({"slow_rank": "slow_node"})
REPLICA_KINDS: Mapping[str, str] = MappingProxyType({"slow_rank": "slow_replica"})


class PeerOutlier(Stepwise):
    """Flags ranks whose features deviate from their peers at the same step.

    Args:
        features: feature -> PeerFeature (or ``(direction, kind[, min_shift])``);
            defaults to DEFAULT_FEATURES. Names may be aliases (collector.vocabulary).
        z: robust z-score a value must exceed.
        min_shift: relative deviation from the peer median it must also exceed, so a
            tight fleet (tiny MAD) does not fire on harmless differences.
        persistence: consecutive reports a rank must be out (three of its last five
            reports beyond the bar) before it fires.
        clear: consecutive normal reports before a fired rank may fire again.
        min_ranks: peers needed for a comparison.
        node_fraction: share of a node's ranks (and at least two) that makes a node finding.
        replica_fraction: share of a multi-node replica's ranks that makes a replica finding.
        warmup: steps after a rank's (re)launch in which it is not compared.
        offset_alpha: how fast a rank's stable offset follows it (0 freezes it at 1).
        sustained_z: the mean robust z (about the last ten reports) that may beat the bar
            instead, for the features whose offsets are removed (0 turns it off): a shift
            of a few deviations held report after report, as a GPU that became 10 %
            slower under heavy-tailed noise (detectors._peercore).

    >>> from collector.types import Frame, Subject
    >>> det = PeerOutlier(persistence=1, offset_alpha=0)  # no learnt offsets: judge at once
    >>> rows = [Frame(Subject(0, r, f"n{r // 4}"), 1, 0.0,
    ...               {"compute_ms": 200.0 if r == 5 else 100.0 + r % 3}) for r in range(8)]
    >>> batch = StepBatch.from_frames(rows)
    >>> [(f.kind, str(f.subject)) for f in det.process_step(batch)]
    [('slow_rank', 'rank 5')]
    """

    name = "peer_outlier"

    def __init__(
        self,
        features: Mapping[str, object] | None = None,
        z: float = 6.0,
        min_shift: float = 0.06,
        persistence: int = 2,
        clear: int = 5,
        min_ranks: int = 4,
        node_fraction: float = 0.5,
        replica_fraction: float = 0.8,
        warmup: int = 20,
        offset_alpha: float = 0.05,
        sustained_z: float = 3.0,
    ) -> None:
        spec = dict(features) if features is not None else dict(DEFAULT_FEATURES)
        self.features = {canonical_name(k): PeerFeature.parse(k, v) for k, v in spec.items()}
        self.min_ranks, self.z, self.min_shift = min_ranks, z, min_shift
        self.core = PeerCore(z, persistence, clear, warmup, offset_alpha, sustained_z)
        for name, f in self.features.items():
            shift = min_shift if f.min_shift is None else f.min_shift
            offset = f.offset and offset_alpha > 0
            # Held over many reports, a rank's own fixed difference (a fast GPU waits
            # longer in every all-reduce) would look like a shift: the sustained bar is
            # for features compared after their offsets are removed.
            self.core.add(
                name,
                f.direction,
                shift,
                f.min_abs,
                offset,
                f.votes,
                f.persistence,
                sustained=offset,
                step_share=f.step_share,
                net_of=None if f.net_of is None else canonical_name(f.net_of),
            )
        self._kinds = [f.kind for f in self.features.values()]
        self._groups = GroupFindings(
            self.core,
            self._kinds.__getitem__,
            self.name,
            NODE_KINDS,
            REPLICA_KINDS,
            node_fraction,
            replica_fraction,
            EXPLAINED_BY,
        )

    def process_step(self, batch: StepBatch) -> Sequence[Finding]:
        """Compares the ranks of one step and returns the newly confirmed outliers."""
        raw = self.core.gather(batch)
        if raw is None:
            return ()
        cmp = self.core.compare(batch, raw, self.min_ranks)
        if cmp is None:
            return ()
        return self._groups.findings(cmp, batch)
