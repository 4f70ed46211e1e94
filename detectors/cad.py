"""Contextual Anomaly Detector, after Smirnov's open-source edition (CAD OSE, NAB's contextOSE).

Our own implementation of the published algorithm (github.com/smirmik/CAD; NAB's
nab/detectors/context_ose). Each value is quantised into ``2 ** bits`` bins of the value
range; the bin number's binary digits become a set of *facts* (digit position and value).
A *context* pairs a left set of facts (the previous step's facts plus the ids of the
contexts active then, the "neurons") with a right set (the current step's facts). At each
step the detector counts how many of the contexts whose left part matched the previous
step also see their right part now (predicted), and how many new contexts the step adds;
the surprise is ``(1 - share predicted + share new) / 2`` in [0, 1]. A score at least
``base`` silences the returned score for ``rest`` steps (NAB's rest period).

Streaming: one pass, causal. Published CAD OSE is given each file's minimum and maximum
(a look-ahead NAB grants every detector); the NAB families take the range from the
probation instead. A value outside the range falls into bins beyond it, whose binary
digits are facts never seen before: novelty by construction. Memory grows with the
contexts learnt; at ``max_contexts`` it stops learning new ones (bounded memory for a
long-lived metric). The per-context work of a step is done on arrays (one numpy pass over
the contexts), so a step costs O(contexts) vectorised.
"""

from __future__ import annotations

import numpy as np

from detectors.errors import DetectorError

Facts = tuple[int, ...]
#: Fact offsets of the bins above and below the range (neurons are 2 ** 31 + id).
_ABOVE, _BELOW = 1 << 28, 1 << 29


class _Side:
    """The semi-contexts of one side: their facts, sizes, and which hold each fact."""

    def __init__(self) -> None:
        self.ids: dict[Facts, int] = {}
        self.facts: list[frozenset[int]] = []
        self.size = np.zeros(0, dtype=np.int64)
        self.by_fact: dict[int, list[int]] = {}
        self._arrays: dict[int, np.ndarray] = {}
        self.hits = np.zeros(0, dtype=np.int64)  # per semi: facts of the last crossing held
        self.crossed: Facts = ()  # the facts of the last crossing

    def get(self, facts: Facts) -> int:
        sid = self.ids.get(facts)
        if sid is None:
            sid = self.ids[facts] = len(self.facts)
            self.facts.append(frozenset(facts))
            if sid >= len(self.size):
                self.size = np.concatenate([self.size, np.zeros(max(sid, 64), np.int64)])
            self.size[sid] = len(facts)
            for fact in facts:
                self.by_fact.setdefault(fact, []).append(sid)
                self._arrays.pop(fact, None)
        return sid

    def cross(self, facts: Facts) -> None:
        """Counts, for every semi-context, how many of ``facts`` it holds."""
        parts = []
        for fact in facts:
            arr = self._arrays.get(fact)
            if arr is None:
                ids = self.by_fact.get(fact)
                if ids is None:
                    continue
                arr = self._arrays[fact] = np.array(ids, dtype=np.int64)
            parts.append(arr)
        n = len(self.facts)
        flat = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        self.hits = np.bincount(flat, minlength=n)
        self.crossed = facts

    def held(self, sid: int) -> Facts:
        """The facts of the last crossing that semi-context ``sid`` holds, in their order."""
        mine = self.facts[sid]
        return tuple(f for f in self.crossed if f in mine)


class _ContextMemory:
    """Smirnov's ContextOperator, its per-context loop done on arrays.

    A context is a (left semi-context, right semi-context) pair with a count of the times
    it was seen whole, and whether it was founded as a zero-level context.
    """

    def __init__(self, max_left: int, max_contexts: int, as_published: bool = False) -> None:
        self.max_left = max_left
        self.max_contexts = max_contexts
        self.as_published = as_published
        self.sides = (_Side(), _Side())
        self.pairs: dict[tuple[int, int], int] = {}
        self.n = 0
        cap = 256
        self.left = np.zeros(cap, np.int64)
        self.right = np.zeros(cap, np.int64)
        self.count = np.zeros(cap, np.int64)
        self.zero = np.zeros(cap, bool)
        self.left_hash = np.zeros(cap, np.int64)
        self.right_hash = np.zeros(cap, np.int64)
        self.new_context = -1

    def _grow(self) -> None:
        for name in ("left", "right", "count", "zero", "left_hash", "right_hash"):
            arr = getattr(self, name)
            setattr(self, name, np.concatenate([arr, np.zeros_like(arr)]))

    def add(self, pairs: list[tuple[Facts, Facts]], zero_level: bool = False) -> int:
        """Stores contexts; returns how many were new (zero level: 1 if the one was new)."""
        added = 0
        for left, right in pairs:
            if self.n >= self.max_contexts:
                return added
            lid, rid = self.sides[0].get(left), self.sides[1].get(right)
            cid = self.pairs.get((lid, rid))
            if cid is None:
                cid = self.pairs[(lid, rid)] = self.n
                if cid >= len(self.left):
                    self._grow()
                self.left[cid], self.right[cid] = lid, rid
                self.count[cid], self.zero[cid] = 0, zero_level
                # Python's tuple hashes (64-bit): the tie-break among equal counts.
                self.left_hash[cid], self.right_hash[cid] = hash(left), hash(right)
                self.n += 1
                added += 1
                if zero_level:
                    self.new_context = cid
                    return 1
            elif zero_level:
                self.zero[cid] = True
                return 0
        return added

    def active(
        self, new_flag: bool, max_active: int
    ) -> tuple[np.ndarray, float, list[tuple[Facts, Facts]]]:
        """The strongest contexts seen whole now, the share predicted, new candidates."""
        n = self.n
        lefts, rights = self.sides
        lid, rid = self.left[:n], self.right[:n]
        lhits = np.zeros(n, np.int64)
        known = lid < len(lefts.hits)
        lhits[known] = lefts.hits[lid[known]]
        rhits = rights.hits[rid]
        full = lhits == lefts.size[lid]
        considered = lhits > 0
        skipped = self.new_context
        if skipped < 0 and self.as_published:
            skipped = 0  # the published code's "no new context" is False, and False == 0
        if 0 <= skipped < n:
            considered[skipped] = False
        self.new_context = -1
        chosen = considered & full
        selected = int(chosen.sum())
        whole_right = (rhits > 0) & (rhits == rights.size[rid])
        act = np.flatnonzero(chosen & whole_right)
        self.count[act] += 1
        candidates: list[tuple[Facts, Facts]] = []
        if new_flag:
            may = considered & self.zero[:n] & (rhits > 0) & (lhits <= self.max_left)
            may &= ~(full & whole_right)
            cids = np.flatnonzero(may)
            # The published loop's order: left semi-contexts as learnt, then contexts.
            for cid in cids[np.lexsort((cids, lid[cids]))]:
                candidates.append((lefts.held(int(lid[cid])), rights.held(int(rid[cid]))))
        order = np.lexsort((self.right_hash[act], self.left_hash[act], self.count[act]))
        strongest = act[order[-max_active:]] if max_active else act[:0]
        predicted = len(act) / selected if selected else 0.0
        return strongest, predicted, candidates


class CadOse:
    """One series' CAD OSE state: ``update(value)`` returns the returned score in [0, 1].

    Args:
        low, high: the value range quantised into ``2 ** bits`` bins.
        base: a raw score at least this silences the returned score for ``rest`` steps.
        rest: steps of silence after a score at least ``base``.
        max_left: the largest left semi-context that can found new contexts.
        max_active: the most contexts ("neurons") carried into the next step's left facts.
        bits: bits of the quantised value.
        max_contexts: contexts learnt at most.
        as_published: also skip context 0 at every step that founds no context, as the
            published code does (its marker for "none" is ``False``, which equals 0);
            used to reproduce NAB's contextOSE figures.
    """

    def __init__(
        self,
        low: float,
        high: float,
        base: float = 0.75,
        rest: int = 30,
        max_left: int = 7,
        max_active: int = 15,
        bits: int = 3,
        max_contexts: int = 200_000,
        as_published: bool = False,
    ) -> None:
        if not (np.isfinite(low) and np.isfinite(high)) or high < low:
            raise DetectorError(f"CAD needs a finite range low <= high, got [{low}, {high}]")
        if bits < 1 or rest < 0 or max_contexts < 1:
            raise DetectorError("CAD needs bits >= 1, rest >= 0 and max_contexts >= 1")
        self.low, self.base, self.rest = float(low), base, int(rest)
        self.max_active, self.bits = max_active, bits
        top = 2.0**bits - 1.0
        span = float(high - low) or top
        self.step_size = span / top
        self.memory = _ContextMemory(max_left, max_contexts, as_published)
        self.left: Facts = ()
        self.since_base = 0  # steps since the last raw score >= base (NAB's history starts at 1.0)

    def facts(self, value: float) -> Facts:
        """The binary digits of the value's bin as facts (2 * position + digit).

        Inside the range, ``2 ** bits`` bins as CAD OSE. Beyond it, bins double in width
        (1, 2, 3 .. at 1, 3, 7 .. range spans past it), and their digits are facts of their
        own above and below, which no context learnt inside the range holds: a new
        extreme is new facts, without every later value of a drifted series founding
        contexts of its own.
        """
        top = (1 << self.bits) - 1
        if not np.isfinite(value):
            return (_BELOW - 1,)
        level = (value - self.low) / self.step_size
        offset = 0
        if level > top:
            level, offset = np.log2(1.0 + (level - top) / top) + 1.0, _ABOVE
        elif level < 0:
            level, offset = np.log2(1.0 - level / top) + 1.0, _BELOW
        bin_ = int(level)
        width = max(self.bits, bin_.bit_length())
        return tuple(offset + 2 * k + ((bin_ >> k) & 1) for k in range(width))

    def raw(self, value: float) -> float:
        """The raw surprise of the value (before the rest period)."""
        mem = self.memory
        now = self.facts(value)
        pending: set[tuple[Facts, Facts]] = set()
        new_flag = False
        if self.left:
            zero = (self.left, now)
            pending.add(zero)
            new_flag = mem.add([zero], zero_level=True) == 1
        mem.sides[1].cross(now)
        strongest, predicted, candidates = mem.active(new_flag, self.max_active)
        pending.update(candidates)
        neurons = {(1 << 31) + int(c) for c in strongest}
        self.left = tuple(sorted(set(now) | neurons))
        added = mem.add(candidates) if candidates else 0
        mem.sides[0].cross(self.left)
        added += 1 if new_flag else 0
        novel = added / len(pending) if new_flag and pending else 0.0
        return (1.0 - predicted + novel) / 2.0

    def update(self, value: float) -> float:
        score = self.raw(value)
        quiet = self.since_base >= self.rest
        self.since_base = 0 if score >= self.base else self.since_base + 1
        return score if quiet else 0.0


def cad_scores(values: np.ndarray, low: float, high: float, **options: float | bool) -> np.ndarray:
    """The raw CAD surprise of every point of a series, in one causal pass."""
    cad = CadOse(low, high, **options)  # type: ignore[arg-type]
    return np.array([cad.raw(float(v)) for v in values], dtype=float)


def rest_filter(raw: np.ndarray, base: float, rest: int) -> np.ndarray:
    """NAB's rest period on raw scores: 0 while a score >= ``base`` came in the last ``rest``."""
    out = np.zeros(len(raw))
    since = 0  # NAB's history starts with a 1.0, so the first ``rest`` points return 0
    for i, r in enumerate(raw):
        if since >= rest:
            out[i] = r
        since = 0 if r >= base else since + 1
    return out


def probation_range(values: np.ndarray, probation: int, margin: float = 0.0) -> tuple[float, float]:
    """The range of the probation's finite values, widened by ``margin`` times its span."""
    head = np.asarray(values[: max(probation, 1)], dtype=float)
    head = head[np.isfinite(head)]
    if not len(head):
        return 0.0, 1.0
    low, high = float(head.min()), float(head.max())
    return low - margin * (high - low), high + margin * (high - low)
