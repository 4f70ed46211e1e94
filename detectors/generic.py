"""Any numeric per-rank metric no detector knows is still watched against its peers.

A user's own metric (``step_end(step, my_queue_depth=...)``), or a source's gauge that no
rule reads (``gpu_util``, ``power``, ``sm_active``, a counter's rate), needs no code: each
is compared across ranks as the peer detector compares its features (detectors._peercore:
the rank's stable offset divided out, three of five reports beyond the bar, absolute and
relative floors, warm-up after launches), in both directions since nobody said which way
is bad, with wider bars since nobody said how noisy it is. A finding has kind
``metric_outlier`` and names the metric; several ranks of a node give a node finding.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from collector.vocabulary import METRICS, SECTION_PREFIX
from detectors._buffer import Stepwise
from detectors._peercore import PeerCore
from detectors._peergroups import GroupFindings
from detectors.peer import DEFAULT_FEATURES
from detectors.stepbatch import StepBatch
from detectors.trend import DEFAULT_TRENDS
from detectors.types import Finding

#: Known metrics other detectors read, or that differ across healthy ranks by design.
WATCHED_ELSEWHERE = frozenset(
    {
        *DEFAULT_FEATURES,
        *DEFAULT_TRENDS,
        "loss",
        "grad_norm",
        "grad_norm_local",
        "step_time",
        "since_launch",
        "throttle_reasons",  # a bitmask: its meaning is in its bits (throttle_thermal)
    }
)
#: Known metrics that are not comparable levels: counters, events and flags of lifecycle.
NOT_LEVELS = frozenset(m.name for m in METRICS.values() if m.kind != "gauge")


def watchable(name: str, exclude: Iterable[str] = ()) -> bool:
    """Whether the generic comparison takes a feature: numeric levels no one else reads.

    Section times are parts of ``compute_ms``; names with a dot are aggregates of a node
    or replica (``step_time.max``), not a rank's own values.
    """
    if name in WATCHED_ELSEWHERE or name in NOT_LEVELS or name in set(exclude):
        return False
    return not name.startswith(SECTION_PREFIX) and "." not in name


#: The kind of every finding of this detector.
GENERIC_KIND = "metric_outlier"


def _kind(column: int) -> str:
    return GENERIC_KIND


class GenericPeer(Stepwise):
    """Fires ``metric_outlier`` on a rank whose unwatched metric leaves its peers.

    Args:
        z: robust z-score a value must exceed (wider than the peer detector's default).
        min_shift: relative deviation from the peer median it must also exceed.
        persistence: consecutive out reports before firing.
        clear: calm reports before the rank may fire again.
        warmup: steps after a (re)launch in which a rank is not compared.
        exclude: more feature names to leave alone.
        max_features: most features watched (the first ones seen), bounding memory.
    """

    name = "generic_peer"

    def __init__(
        self,
        z: float = 8.0,
        min_shift: float = 0.2,
        persistence: int = 3,
        clear: int = 10,
        warmup: int = 20,
        exclude: Sequence[str] = (),
        max_features: int = 64,
        min_ranks: int = 4,
    ) -> None:
        self.exclude, self.max_features = tuple(exclude), max_features
        self.min_shift, self.min_ranks = min_shift, min_ranks
        self.core = PeerCore(z, persistence, clear, warmup, offset_alpha=0.05)
        self._groups = GroupFindings(self.core, _kind, self.name, {}, {}, 0.5, 0.8)
        self._judged: set[str] = set()

    def process_step(self, batch: StepBatch) -> Sequence[Finding]:
        self._watch(batch.features)
        raw = self.core.gather(batch)
        if raw is None:
            return ()
        cmp = self.core.compare(batch, raw, self.min_ranks)
        if cmp is None:
            return ()
        return self._groups.findings(cmp, batch)

    def _watch(self, features: Iterable[str]) -> None:
        for name in features:
            if name in self._judged:
                continue
            self._judged.add(name)
            if watchable(name, self.exclude) and len(self.core.names) < self.max_features:
                self.core.add(name, 0, self.min_shift, 0.0, True)
