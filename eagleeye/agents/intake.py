"""The controller's intake of host summaries: frames for the detectors, sized by the
hosts and the ranks that stand out, not by the ranks.

Each summary's outlier rows become rank frames at once (the raw values of that rank's
step, with the host's median of each metric as ``<metric>.host_median`` beside them).
A step of every host is then reduced once more, vectorised across hosts, when every
host has sent it or ``wait_s`` after the first did: one job frame (per metric the
median of the hosts' medians, the lowest minimum, the highest maximum; the ranks and
hosts reporting) and a node frame for each host whose median stands out against the
other hosts' (the same test the agents apply to their ranks). The summaries come in
blocks (``summarybatch.SummaryBlock``: a drained socket's summaries, checked at once); a
summary whose statistics are not sound never reaches the intake's steps.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from collector.types import Frame, Subject
from eagleeye.agents.summary import STATS, Parsed, Reduction, stats_sound
from eagleeye.agents.summarybatch import SummaryBlock, block_of
from eagleeye.agents.wire import Refused
from ft_runtime.layout import JobLayout


@dataclass
class _Step:
    """One step's summaries, in blocks of hosts alike: node ranks, ranks, metric names,
    statistics (hosts × metrics × 5)."""

    first: float
    attempt: int
    hosts: int = 0
    nodes: list[np.ndarray] = field(default_factory=list)
    ranks: list[np.ndarray] = field(default_factory=list)
    names: list[tuple[str, ...]] = field(default_factory=list)
    stats: list[np.ndarray] = field(default_factory=list)


@dataclass(frozen=True, eq=False)
class HostMedians:
    """One step of every host that sent it: each metric's median over the host's ranks
    (``medians``: metrics × hosts, NaN where a host has no such metric), by node rank."""

    step: int
    attempt: int
    time: float
    nodes: np.ndarray  # node ranks, one per column
    names: tuple[str, ...]
    medians: np.ndarray


@dataclass
class SummaryIntake:
    """Args:
    layout: the job's layout (which ranks each node rank runs).
    reduction: when a host stands out against the others.
    wait_s: longest a step waits for its slowest host.
    max_steps: steps kept waiting; older ones are reduced early.
    """

    layout: JobLayout
    reduction: Reduction = field(default_factory=Reduction)
    wait_s: float = 5.0
    max_steps: int = 16
    clock: Callable[[], float] = time.time
    summaries: int = 0
    nbytes: int = 0
    refused: Counter[str] = field(default_factory=Counter)
    _steps: dict[tuple[int, int], _Step] = field(default_factory=dict)  # (attempt, step)
    _frames: list[Frame] = field(default_factory=list)
    _done: dict[int, int] = field(default_factory=dict)  # attempt -> newest step reduced
    _medians: list[HostMedians] = field(default_factory=list)

    def take(self, node_rank: int, parsed: Parsed, nbytes: int, now: float) -> None:
        """One host's summary (``parse_summary``'s parts, its statistics not yet checked:
        unsound ones are refused and counted), from the agent of ``node_rank``.

        Raises:
            Refused: an outlier row names a rank that is not this host's.
        """
        if not stats_sound(parsed[6], parsed[4]):
            self.refused["schema"] += 1
            return
        for _, exc in self.take_block([node_rank], block_of([parsed], [0], [nbytes]), now):
            raise exc

    def take_block(
        self, nodes: Sequence[int] | np.ndarray, block: SummaryBlock, now: float
    ) -> list[tuple[int, Refused]]:
        """Hosts' summaries as ``summarybatch.parse_payloads`` accepted them (checked
        sound), from the agents of the node ranks ``nodes`` (one per message). Returns
        the messages refused here (a position in ``block.index``, why): an outlier row
        naming a rank that is not its host's."""
        nodes = np.asarray(nodes, dtype=np.int64)
        refused = []
        if block.rows:
            keep = np.ones(len(block), dtype=bool)
            for j, rows in enumerate(block.rows):
                stray = [r.rank for r in rows if not self._owns(int(nodes[j]), r.rank)]
                if stray:
                    keep[j] = False
                    why = f"node rank {int(nodes[j])} sent a row of rank {stray[0]}"
                    refused.append((int(block.index[j]), Refused(why, "schema")))
            if refused:
                nodes, block = nodes[keep], block.select(keep)
        steps, attempts = block.steps, block.attempts
        if not len(block):
            return refused
        if steps.min() == steps.max() and attempts.min() == attempts.max():
            keys = [(int(attempts[0]), int(steps[0]))]
            groups = [np.arange(len(block))]
        else:
            pairs = np.stack([attempts, steps], axis=1)
            unique, inverse = np.unique(pairs, axis=0, return_inverse=True)
            keys = [(int(a), int(s)) for a, s in unique.tolist()]
            groups = [np.flatnonzero(inverse.ravel() == k) for k in range(len(keys))]
        for (attempt, step), where in zip(keys, groups, strict=True):
            if step <= self._done.get(attempt, -1):
                self.refused["late"] += len(where)  # its step was reduced without them
                continue
            if block.rows:
                for j in where.tolist():
                    if block.rows[j]:
                        self._outliers(int(nodes[j]), step, attempt, block, j, now)
            pending = self._steps.get((attempt, step))
            if pending is None:
                pending = self._steps[(attempt, step)] = _Step(now, attempt)
            whole = len(where) == len(block)
            pending.hosts += len(where)
            pending.nodes.append(nodes if whole else nodes[where])
            pending.ranks.append(block.ranks if whole else block.ranks[where])
            pending.names.append(block.names)
            pending.stats.append(block.stats if whole else block.stats[where])
            self.summaries += len(where)
            self.nbytes += int(block.nbytes[where].sum())
        return refused

    def _owns(self, node_rank: int, rank: int) -> bool:
        return rank // self.layout.nproc_per_node == node_rank and rank < self.layout.world_size

    def _outliers(
        self, node_rank: int, step: int, attempt: int, block: SummaryBlock, j: int, now: float
    ) -> None:
        medians = block.stats[j, :, 1]
        beside = {f"{n}.host_median": float(m) for n, m in zip(block.names, medians, strict=True)}
        for row in block.rows[j]:
            rank, values = row.rank, row.values
            spec = self.layout.rank(rank)
            subject = Subject(replica=spec.replica, rank=rank, node=spec.node)
            values = {**values, **beside, "attempt": float(attempt)}
            self._frames.append(Frame(subject, step, now, values))

    def frames(self, hosts: int) -> list[Frame]:
        """The frames ready now: outlier rows, then the steps every one of ``hosts`` sent
        (or that waited ``wait_s``) reduced to job and node frames."""
        out, self._frames = self._frames, []
        now = self.clock()
        ready = sorted(
            key
            for key, pending in self._steps.items()
            if pending.hosts >= hosts or now - pending.first >= self.wait_s
        )
        excess = len(self._steps) - len(ready) - self.max_steps
        if excess > 0:
            waiting = sorted(set(self._steps) - set(ready))
            ready = sorted(ready + waiting[:excess])
        # In step order: an older step still waiting is reduced with the newer one (a
        # host that sent the newer step never sends it; one that did not send either waited
        # as long). Released after it, it would be a step going back: a restart to the
        # detectors, whose warm-up starts again.
        newest: dict[int, int] = {}
        for attempt, step in ready:
            newest[attempt] = max(newest.get(attempt, step), step)
        ready = sorted(k for k in self._steps if k[1] <= newest.get(k[0], -1))
        for attempt, step in ready:
            out += self._reduce(step, self._steps.pop((attempt, step)), hosts)
            self._done[attempt] = max(self._done.get(attempt, -1), step)
        return out

    def take_medians(self) -> list[HostMedians]:
        """The hosts' medians of the steps reduced since the last call (for the precise
        comparison of hosts, ``eagleeye.agents.hostpeers``); at most ``max_steps`` kept."""
        out, self._medians = self._medians, []
        return out

    def _reduce(self, step: int, pending: _Step, hosts: int) -> list[Frame]:
        nodes = np.concatenate(pending.nodes)
        ranks = np.concatenate(pending.ranks)
        job = {
            "ranks_reporting": float(ranks.sum()),
            "hosts_reporting": float(len(nodes)),
            "hosts_missing": float(max(hosts - len(nodes), 0)),
            "attempt": float(pending.attempt),
        }
        if not len(nodes):
            return [Frame(Subject(), step, self.clock(), job)]
        first = pending.names[0]
        if pending.names.count(first) == len(pending.names):  # the usual case: one vocabulary
            names, blocks, gaps = first, pending.stats, False  # sound: no NaN
        else:
            names, table = _union(pending.names, pending.stats)
            blocks, gaps = [table], bool(np.isnan(table[:, :, 1]).any())
        # metrics × hosts, the only copy of a step's statistics made here
        medians = np.concatenate([b[:, :, 1] for b in blocks]).T.copy()
        with np.errstate(all="ignore"):
            centre = (np.nanmedian if gaps else np.median)(medians, axis=1)
            low, high = (np.nanmin, np.nanmax) if gaps else (np.min, np.max)
            lows = low([low(b[:, :, 2], axis=0) for b in blocks], axis=0)
            highs = high([high(b[:, :, 3], axis=0) for b in blocks], axis=0)
        for which, column in (("median", centre), ("min", lows), ("max", highs)):
            job.update({f"{n}.{which}": float(v) for n, v in zip(names, column, strict=True)})
        now = self.clock()
        self._medians = [
            *self._medians[-self.max_steps + 1 :],
            HostMedians(step, pending.attempt, now, nodes, names, medians),
        ]
        starts = np.cumsum([0] + [len(b) for b in blocks])
        out = []
        for j in self._standing_out(medians, centre, gaps):
            at = int(np.searchsorted(starts, j, side="right")) - 1
            host = blocks[at][j - starts[at]].T  # 5 × metrics
            out.append(self._node_frame(int(nodes[j]), step, names, host))
        return [*out, Frame(Subject(), step, self.clock(), job)]

    def _standing_out(self, medians: np.ndarray, centre: np.ndarray, gaps: bool) -> list[int]:
        """The hosts whose median stands out on some metric against the hosts' median
        (judged on the metrics that three hosts or more report)."""
        distance = np.abs(medians - centre[:, None])
        with np.errstate(all="ignore"):
            spread = 1.4826 * (np.nanmedian if gaps else np.median)(distance, axis=1)
        r = self.reduction
        bar = np.maximum(np.maximum(r.z * spread, r.rel * np.abs(centre)), r.floor)
        judged = (~np.isnan(medians)).sum(axis=1) >= 3
        out = (distance > bar[:, None]) & judged[:, None]
        return [int(j) for j in np.flatnonzero(out.any(axis=0))]

    def _node_frame(
        self, node_rank: int, step: int, names: tuple[str, ...], table: np.ndarray
    ) -> Frame:
        """A host's frame from its statistics (5 × metrics)."""
        values = {"ranks_reporting": float(np.nanmax(table[0], initial=0.0))}
        for k, which in enumerate(STATS[1:], start=1):
            column = zip(names, table[k], strict=True)
            values.update({f"{n}.{which}": float(v) for n, v in column if not math.isnan(v)})
        node = self.layout.rank(node_rank * self.layout.nproc_per_node).node
        return Frame(Subject(node=node), step, self.clock(), values)


def _union(
    names: list[tuple[str, ...]], stats: list[np.ndarray]
) -> tuple[tuple[str, ...], np.ndarray]:
    """The union of the hosts' metrics and their statistics as one hosts × metrics × 5
    array (``STATS`` last; NaN where a host has no such metric)."""
    union = tuple(sorted({n for block in names for n in block}))
    index = {n: i for i, n in enumerate(union)}
    table = np.full((sum(len(b) for b in stats), len(union), 5), np.nan)
    at = 0
    for block_names, block in zip(names, stats, strict=True):
        cols = [index[n] for n in block_names]
        table[at : at + len(block)][:, cols] = block
        at += len(block)
    return union, table


__all__ = ["HostMedians", "SummaryIntake"]
