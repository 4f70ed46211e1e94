"""The controller's intake of host summaries: frames for the detectors, sized by the
hosts and the ranks that stand out, not by the ranks.

Each summary's outlier rows become rank frames at once (the raw values of that rank's
step, with the host's median of each metric as ``<metric>.host_median`` beside them).
A step of every host is then reduced once more, vectorised across hosts, when every
host has sent it or ``wait_s`` after the first did: one job frame (per metric the
median of the hosts' medians, the lowest minimum, the highest maximum; the ranks and
hosts reporting) and a node frame for each host whose median stands out against the
other hosts' (the same test the agents apply to their ranks). A summary whose statistics
are not sound is refused as the step is reduced, before any of it is used.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from collector.types import Frame, Subject
from eagleeye.agents.summary import STATS, Parsed, RankRow, Reduction
from eagleeye.agents.wire import Refused
from ft_runtime.layout import JobLayout


@dataclass
class _Step:
    """One step's summaries, host by host: node rank, ranks, metric names, statistics."""

    first: float
    attempt: int
    nodes: list[int] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)
    names: list[tuple[str, ...]] = field(default_factory=list)
    stats: list[bytes] = field(default_factory=list)


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

    def take(self, node_rank: int, parsed: Parsed, nbytes: int, now: float) -> None:
        """One host's summary (``parse_summary``'s parts), from the agent of ``node_rank``.

        Raises:
            Refused: an outlier row names a rank that is not this host's.
        """
        _, _, step, attempt, ranks, names, stats, rows = parsed
        if step <= self._done.get(attempt, -1):
            self.refused["late"] += 1  # its step was reduced without it
            return
        if rows:
            self._outliers(node_rank, step, attempt, names, stats, rows, now)
        pending = self._steps.get((attempt, step))
        if pending is None:
            pending = self._steps[(attempt, step)] = _Step(now, attempt)
        pending.nodes.append(node_rank)
        pending.ranks.append(ranks)
        pending.names.append(names)
        pending.stats.append(stats)
        self.summaries += 1
        self.nbytes += nbytes

    def _outliers(
        self,
        node_rank: int,
        step: int,
        attempt: int,
        names: tuple[str, ...],
        stats: bytes,
        rows: Sequence[RankRow],
        now: float,
    ) -> None:
        medians = np.frombuffer(stats, "<f8").reshape(len(names), 5)[:, 1]
        beside = {f"{n}.host_median": float(m) for n, m in zip(names, medians, strict=True)}
        per_node = self.layout.nproc_per_node
        for row in rows:
            rank, values = row.rank, row.values
            if rank // per_node != node_rank or rank >= self.layout.world_size:
                raise Refused(f"node rank {node_rank} sent a row of rank {rank}", "schema")
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
            if len(pending.nodes) >= hosts or now - pending.first >= self.wait_s
        )
        excess = len(self._steps) - len(ready) - self.max_steps
        if excess > 0:
            waiting = sorted(set(self._steps) - set(ready))
            ready = sorted(ready + waiting[:excess])
        for attempt, step in ready:
            out += self._reduce(step, self._steps.pop((attempt, step)), hosts)
            self._done[attempt] = max(self._done.get(attempt, -1), step)
        return out

    def _reduce(self, step: int, pending: _Step, hosts: int) -> list[Frame]:
        nodes = np.array(pending.nodes, dtype=np.int64)
        ranks = np.array(pending.ranks, dtype=np.float64)
        names, table = _table(pending.names, pending.stats)
        sound = _sound(table, ranks)
        if not sound.all():
            self.refused["schema"] += int((~sound).sum())
            nodes, ranks, table = nodes[sound], ranks[sound], table[:, :, sound]
        job = {
            "ranks_reporting": float(ranks.sum()),
            "hosts_reporting": float(len(nodes)),
            "hosts_missing": float(max(hosts - len(nodes), 0)),
            "attempt": float(pending.attempt),
        }
        if not len(nodes):
            return [Frame(Subject(), step, self.clock(), job)]
        medians = table[1]  # metrics × hosts
        gaps = bool(np.isnan(medians).any())
        with np.errstate(all="ignore"):
            centre = (np.nanmedian if gaps else np.median)(medians, axis=1)
            lows = (np.nanmin if gaps else np.min)(table[2], axis=1)
            highs = (np.nanmax if gaps else np.max)(table[3], axis=1)
        for which, column in (("median", centre), ("min", lows), ("max", highs)):
            job.update({f"{n}.{which}": float(v) for n, v in zip(names, column, strict=True)})
        out = [
            self._node_frame(int(nodes[j]), step, names, table[:, :, j])
            for j in self._standing_out(medians, centre, gaps)
        ]
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


def _table(names: list[tuple[str, ...]], stats: list[bytes]) -> tuple[tuple[str, ...], np.ndarray]:
    """The union of the hosts' metrics and their statistics as one contiguous
    5 × metrics × hosts array (``STATS`` first; NaN where a host has no such metric)."""
    first = names[0]
    if names.count(first) == len(names):  # the usual case: one vocabulary
        flat = np.frombuffer(b"".join(stats), "<f8").reshape(len(stats), len(first), 5)
        return first, np.ascontiguousarray(flat.transpose(2, 1, 0))
    union = tuple(sorted({n for host in names for n in host}))
    index = {n: i for i, n in enumerate(union)}
    table = np.full((5, len(union), len(stats)), np.nan)
    for j, (host, block) in enumerate(zip(names, stats, strict=True)):
        cols = [index[n] for n in host]
        table[:, cols, j] = np.frombuffer(block, "<f8").reshape(len(host), 5).T
    return union, table


def _sound(table: np.ndarray, ranks: np.ndarray) -> np.ndarray:
    """Which hosts' statistics are sound (as ``check_stats``; NaN: no such metric)."""
    count, median, low, high, spread = table
    missing = np.isnan(table).all(axis=0)  # a metric this host does not report
    with np.errstate(invalid="ignore"):
        present = (
            np.isfinite(table).all(axis=0)
            & (low <= median)
            & (median <= high)
            & (spread >= 0)
            & (count >= 0)
            & (count <= ranks)
        )
    return np.asarray((present | missing).all(axis=0), dtype=bool)


__all__ = ["SummaryIntake"]
