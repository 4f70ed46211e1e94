"""Many host summaries parsed together, on the controller.

The controller drains its socket and hands the payloads of the summaries whose sender,
MAC and sequence number it checked (one HMAC per message) to ``parse_payloads``. The
messages that look alike (one length, one vocabulary of metric names, no outlier rows:
a step of healthy hosts) have their headers, names and statistics checked in one
vectorised pass over a ``messages × bytes`` array; every other message is parsed alone
(``summary.parse_payload``, whose rules the vectorised pass applies: a message it does
not accept goes that way, and is accepted or refused there). Every accepted message's
statistics are then checked sound (every number finite, min ≤ median ≤ max, spread ≥ 0,
0 ≤ count ≤ ranks). What comes out is ``SummaryBlock``s, one per vocabulary, and the
refusals by position; nothing refused is in a block.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Protocol

import numpy as np

from eagleeye.agents.summary import (
    MAGIC,
    MAX_METRICS,
    MAX_RANKS,
    SUMMARY_VERSION,
    Parsed,
    RankRow,
    _names,
    parse_payload,
)
from eagleeye.agents.wire import Refused, Sequencer

#: The summary's header (``summary._HEADER``) as a numpy record.
HEADER = np.dtype(
    {
        "names": [
            "magic",
            "version",
            "session",
            "seq",
            "step",
            "attempt",
            "ranks",
            "metrics",
            "outliers",
            "names_len",
        ],
        "formats": ["S4", "u1", ">u8", "<u8", "<i8", "<u4", "<u4", "<u2", "<u2", "<u2"],
        "offsets": [0, 4, 5, 13, 21, 29, 33, 37, 39, 41],
        "itemsize": 43,
    }
)
HEADER_SIZE = HEADER.itemsize
#: Fewer messages alike than this are parsed one by one.
MIN_BATCH = 8


@dataclass(frozen=True, eq=False)
class SummaryBlock:
    """Accepted summaries with one vocabulary, a row per message.

    ``index``: the messages' positions in what was parsed; ``sessions``: the senders'
    sessions as numbers (``wire.session_key``); ``stats``: messages × metrics × 5
    (``summary.STATS``), float64; ``rows``: each message's outlier rows (empty when
    none of them has any).
    """

    index: np.ndarray
    sessions: np.ndarray
    seqs: np.ndarray
    steps: np.ndarray
    attempts: np.ndarray
    ranks: np.ndarray
    nbytes: np.ndarray
    names: tuple[str, ...]
    stats: np.ndarray
    rows: tuple[tuple[RankRow, ...], ...] = ()

    def __len__(self) -> int:
        return len(self.index)

    def select(self, keep: np.ndarray) -> SummaryBlock:
        """The messages where ``keep`` (a boolean mask) holds."""
        rows = (
            tuple(r for r, k in zip(self.rows, keep.tolist(), strict=True) if k)
            if self.rows
            else ()
        )
        return SummaryBlock(
            self.index[keep],
            self.sessions[keep],
            self.seqs[keep],
            self.steps[keep],
            self.attempts[keep],
            self.ranks[keep],
            self.nbytes[keep],
            self.names,
            self.stats[keep],
            rows,
        )


def block_of(parsed: Sequence[Parsed], index: Sequence[int], nbytes: Sequence[int]) -> SummaryBlock:
    """One block of messages parsed alone, which share their metric names."""
    names = parsed[0][5]
    stats = np.frombuffer(b"".join(p[6] for p in parsed), "<f8").reshape(len(parsed), len(names), 5)
    rows = tuple(p[7] for p in parsed)
    return SummaryBlock(
        np.array(index, dtype=np.int64),
        np.array([int(p[0], 16) for p in parsed], dtype=np.uint64),
        np.array([p[1] for p in parsed], dtype=np.uint64),
        np.array([p[2] for p in parsed], dtype=np.int64),
        np.array([p[3] for p in parsed], dtype=np.int64),
        np.array([p[4] for p in parsed], dtype=np.int64),
        np.array(nbytes, dtype=np.int64),
        names,
        stats,
        rows if any(rows) else (),
    )


def parse_payloads(
    payloads: Sequence[bytes],
) -> tuple[list[SummaryBlock], list[tuple[int, Refused]]]:
    """The blocks of the summaries in ``payloads`` (MACs already checked) and the
    refused ones (position, why)."""
    blocks: list[SummaryBlock] = []
    alone: list[int] = []
    lengths = np.fromiter(map(len, payloads), dtype=np.int64, count=len(payloads))
    sizes, inverse, counts = np.unique(lengths, return_inverse=True, return_counts=True)
    for k, (size, count) in enumerate(zip(sizes.tolist(), counts.tolist(), strict=True)):
        where = np.flatnonzero(inverse == k)
        if count < MIN_BATCH or size < HEADER_SIZE:
            alone += where.tolist()
            continue
        alike = payloads if count == len(payloads) else itemgetter(*where.tolist())(payloads)
        block, rest = _alike(alike, size)
        if block is not None:
            blocks.append(_reindex(block, where))
        alone += where[rest].tolist()
    refused: list[tuple[int, Refused]] = []
    by_names: dict[tuple[str, ...], tuple[list[Parsed], list[int]]] = {}
    for i in sorted(alone):
        try:
            parsed = parse_payload(payloads[i])
        except Refused as exc:
            refused.append((i, exc))
            continue
        group = by_names.setdefault(parsed[5], ([], []))
        group[0].append(parsed)
        group[1].append(i)
    for parsed_list, index in by_names.values():
        blocks.append(block_of(parsed_list, index, [len(payloads[i]) for i in index]))
    out = []
    for block in blocks:
        sound = stats_sound_rows(block.stats, block.ranks)
        if not sound.all():
            refused += [(int(i), _unsound()) for i in block.index[~sound].tolist()]
            block = block.select(sound)
        if len(block):
            out.append(block)
    return out, refused


def _reindex(block: SummaryBlock, where: np.ndarray) -> SummaryBlock:
    """``block`` with its positions mapped from its group's to the whole batch's."""
    return SummaryBlock(
        where[block.index],
        block.sessions,
        block.seqs,
        block.steps,
        block.attempts,
        block.ranks,
        block.nbytes,
        block.names,
        block.stats,
    )


def _alike(payloads: Sequence[bytes], size: int) -> tuple[SummaryBlock | None, np.ndarray]:
    """The messages of one length that share the first one's vocabulary and carry no
    outlier rows, checked at once; and the positions of the others (to parse alone)."""
    count = len(payloads)
    joined = b"".join(payloads)  # one copy; everything below is a view of it
    head = np.ndarray((count,), HEADER, joined, 0, (size,))
    metrics, names_len = int(head["metrics"][0]), int(head["names_len"][0])
    start = HEADER_SIZE + names_len
    everyone = np.arange(count)
    if size != start + 40 * metrics or metrics > MAX_METRICS:
        return None, everyone
    reference = joined[HEADER_SIZE:start]
    try:
        names = _names(reference, metrics)
    except Refused:
        return None, everyone
    fast = (
        (head["magic"] == MAGIC)
        & (head["version"] == SUMMARY_VERSION)
        & (head["outliers"] == 0)
        & (head["metrics"] == metrics)
        & (head["names_len"] == names_len)
        & (head["step"] >= 0)
        & (head["ranks"] > 0)
        & (head["ranks"] <= MAX_RANKS)
    )
    if names_len:
        vocabulary = np.ndarray((count,), f"V{names_len}", joined, HEADER_SIZE, (size,))
        fast &= vocabulary == np.void(reference)
    table = np.ndarray((count, metrics, 5), "<f8", joined, start, (size, 40, 8))
    if fast.all():
        index, picked, stats = everyone, head, table
    else:
        index = np.flatnonzero(fast)
        if not len(index):
            return None, everyone
        picked, stats = head[index], table[index]
    block = SummaryBlock(
        index,
        picked["session"].astype(np.uint64),
        picked["seq"].astype(np.uint64),
        picked["step"].astype(np.int64),
        picked["attempt"].astype(np.int64),
        picked["ranks"].astype(np.int64),
        np.full(len(index), size, dtype=np.int64),
        names,
        stats,
    )
    return block, np.flatnonzero(~fast)


def stats_sound_rows(stats: np.ndarray, ranks: np.ndarray) -> np.ndarray:
    """Which messages' statistics (messages × metrics × 5) are sound, as
    ``summary.stats_sound`` judges one."""
    if not stats.size:
        return np.ones(len(stats), dtype=bool)
    count, median, low, high, spread = (stats[:, :, k] for k in range(5))
    with np.errstate(invalid="ignore"):
        ok = (
            (low <= median)
            & (median <= high)
            & (spread >= 0)
            & (count >= 0)
            & (count <= ranks[:, None])
        ).all(axis=1)
    ok &= np.isfinite(stats).reshape(len(stats), -1).all(axis=1)
    return np.asarray(ok, dtype=bool)


class _Sender(Protocol):
    agent: str


def check_replays(
    sequencer: Sequencer,
    senders: Sequence[_Sender],
    slots: np.ndarray,
    blocks: list[SummaryBlock],
) -> tuple[list[SummaryBlock], list[tuple[int, Refused]]]:
    """The blocks without the replays, by the sequence numbers of their messages
    (``senders[i].agent`` and ``slots[i]``: the sender of message ``i`` and its slot in
    ``sequencer``), judged in the order the messages came: at once where a sender has one
    message here, of its current session, with a higher seq; one by one
    (``Sequencer.check_seq``) otherwise. Returns the blocks kept and the replays
    (position, why)."""
    if not blocks:
        return [], []
    index = np.concatenate([b.index for b in blocks])
    sessions = np.concatenate([b.sessions for b in blocks])
    seqs = np.concatenate([b.seqs for b in blocks])
    order = np.argsort(index, kind="stable")
    index, sessions, seqs = index[order], sessions[order], seqs[order]
    mine = slots[index]
    tables = sequencer.tables()
    if not len(tables[2]):  # no sender yet: nothing to judge at once
        mine = np.full(len(mine), -1, dtype=np.int64)
    key, keyed = np.frombuffer(tables[0], np.uint64), np.frombuffer(tables[1], np.uint8)
    last = np.frombuffer(tables[2], np.uint64)
    known = mine >= 0
    slot = np.where(known, mine, 0)
    fast = known & (keyed[slot] == 1) & (key[slot] == sessions) & (seqs > last[slot])
    ordered = np.sort(mine)
    repeated = ordered[1:][ordered[1:] == ordered[:-1]]
    if len(repeated):  # a sender with several messages here: judged one by one, in order
        fast &= ~np.isin(mine, repeated)
    last[mine[fast]] = seqs[fast]
    del key, keyed, last, tables  # the tables may grow again
    refused: list[tuple[int, Refused]] = []
    for at, session, seq in zip(
        index[~fast].tolist(), sessions[~fast].tolist(), seqs[~fast].tolist(), strict=True
    ):
        try:
            sequencer.check_seq(senders[at].agent, f"{session:016x}", seq)
        except Refused as exc:
            refused.append((at, exc))
    if not refused:
        return blocks, []
    gone = np.array([at for at, _ in refused])
    kept = [b.select(~np.isin(b.index, gone)) for b in blocks]
    return [b for b in kept if len(b)], refused


def _unsound() -> Refused:
    return Refused("a summary whose statistics are not finite, ordered, in range", "schema")


__all__ = [
    "HEADER",
    "SummaryBlock",
    "block_of",
    "check_replays",
    "parse_payloads",
    "stats_sound_rows",
]
