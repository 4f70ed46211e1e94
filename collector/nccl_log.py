"""ProcessGroupNCCL watchdog log lines into collective-timeout events.

When a collective outlives its timeout, ProcessGroupNCCL's watchdog logs (PyTorch 2.x)::

    [rank0]:[E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:629] [Rank 0] Watchdog caught
    collective operation timeout: WorkNCCL(SeqNum=1, OpType=BROADCAST, NumelIn=131072000,
    NumelOut=131072000, Timeout(ms)=600000) ran for 600081 milliseconds before timing out.

(newer versions name the group: ``[PG ID 0 PG GUID 0(default_pg) Rank 1]``), and then the
group's progress: ``failure detected by watchdog at work sequence id: 1 PG status: last
enqueued work: 547, last completed work: 546`` or ``Timeout at NCCL work: 64214, last
enqueued NCCL work: 64214, last completed NCCL work: 64213.`` Each becomes an event naming
the rank, the process group and the sequence number. The same timeout logged twice (the
watchdog repeats it when its thread ends) is reported once.
"""

from __future__ import annotations

import os
import re
import time as _time
from collections import Counter, deque
from collections.abc import Callable, Mapping

from collector._tail import FileTail
from collector.events import Event, Parsed, clean_label
from collector.types import Sample

_TIMEOUT = re.compile(
    r"Watchdog caught collective operation timeout:\s*WorkNCCL\((?P<fields>.*?)\)\s*"
    r"ran for (?P<ran>\d+) milliseconds"
)
_FIELD = re.compile(r"(\w+(?:\(ms\))?)=([^,]*)")
_PG = re.compile(
    r"\[PG ID (?P<pg>\d+) PG GUID (?P<guid>[^\s(\]]+)(?:\((?P<desc>[^)]*)\))? Rank (?P<rank>\d+)\]"
)
_RANK = re.compile(r"\[Rank (?P<rank>\d+)\]|^\[rank(?P<prefix>\d+)\]")
_WATCHDOG = re.compile(
    r"failure detected by watchdog at work sequence id: (?P<seq>\d+)\s*PG status: "
    r"last enqueued work: (?P<enq>-?\d+), last completed work: (?P<done>-?\d+)"
)
_TIMEOUT_AT = re.compile(
    r"Timeout at NCCL work: (?P<seq>\d+), last enqueued NCCL work: (?P<enq>-?\d+), "
    r"last completed NCCL work: (?P<done>-?\d+)"
)
_FIELD_LABELS = {
    "OpType": "op",
    "NumelIn": "numel_in",
    "NumelOut": "numel_out",
    "Timeout(ms)": "timeout_ms",
}
MAX_LINE = 16384


def parse_watchdog_log(text: str, *, time: float) -> Parsed:
    """Reads watchdog timeout and failure lines out of a training log.

    Args:
        text: log text (any mix of lines; others are ignored).
        time: the time given to the events (glog stamps carry no year).

    Returns:
        ``nccl_timeout`` events (value = the timed-out work's sequence number; labels
        rank, pg_id, pg_desc, op, numel_in, numel_out, timeout_ms, ran_ms),
        ``nccl_watchdog_failure`` events (value = the failed sequence number; labels rank,
        pg_id, last_enqueued, last_completed), and drops: ``malformed_timeout`` for a
        timeout line whose work cannot be read, ``line_too_long``.
    """
    events: list[Event] = []
    seen: set[tuple[str, ...]] = set()
    dropped: Counter[str] = Counter()
    for line in text.splitlines():
        if "Watchdog" not in line and "watchdog" not in line and "Timeout at NCCL" not in line:
            continue
        if len(line) > MAX_LINE:
            dropped["line_too_long"] += 1
            continue
        event = _timeout(line, time) or _failure(line, time)
        if event is None:
            if "collective operation timeout" in line:
                dropped["malformed_timeout"] += 1
            continue
        key = _key(event)
        if key not in seen:
            seen.add(key)
            events.append(event)
    return Parsed(events=tuple(events), dropped=dict(dropped))


def _key(event: Event) -> tuple[str, ...]:
    """What makes two reports the same timeout: kind, rank, group and sequence number."""
    labels = event.labels
    return (event.kind, labels.get("rank", ""), labels.get("pg_id", ""), str(event.value))


def _where(line: str) -> dict[str, str]:
    """rank and process group named by the line's bracketed prefix."""
    pg = _PG.search(line)
    if pg:
        labels = {"rank": pg["rank"], "pg_id": pg["pg"], "pg_guid": clean_label(pg["guid"])}
        if pg["desc"]:
            labels["pg_desc"] = clean_label(pg["desc"])
        return labels
    rank = _RANK.search(line)
    if rank:
        return {"rank": rank["rank"] or rank["prefix"]}
    return {}


def _timeout(line: str, time: float) -> Event | None:
    match = _TIMEOUT.search(line)
    if match is None:
        return None
    fields = dict(_FIELD.findall(match["fields"]))
    try:
        seq = int(fields["SeqNum"])
    except (KeyError, ValueError):
        return None
    labels = _where(line)
    for name, label in _FIELD_LABELS.items():
        if name in fields:
            labels[label] = clean_label(fields[name].strip())
    labels["ran_ms"] = match["ran"]
    op = labels.get("op", "collective")
    who = f"rank {labels['rank']}" if "rank" in labels else "a rank"
    message = f"{who}: {op} #{seq} timed out after {match['ran']} ms"
    return Event("nccl_timeout", time, float(seq), labels, message)


def _failure(line: str, time: float) -> Event | None:
    match = _WATCHDOG.search(line) or _TIMEOUT_AT.search(line)
    if match is None:
        return None
    labels = {**_where(line), "last_enqueued": match["enq"], "last_completed": match["done"]}
    message = (
        f"watchdog failure at work #{match['seq']}: last enqueued {match['enq']}, "
        f"last completed {match['done']}"
    )
    return Event("nccl_watchdog_failure", time, float(match["seq"]), labels, message)


class WatchdogLogSource:
    """Tails a training log and yields each watchdog timeout or failure once.

    Args:
        path: the log file (a rank's stderr, or the launcher's combined log).
        labels: added to every event (say ``node``); the line's own rank wins.
        clock: seconds since the epoch, injected for tests.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        labels: Mapping[str, str] | None = None,
        clock: Callable[[], float] = _time.time,
    ) -> None:
        self._tail = FileTail(path)
        self._labels = dict(labels or {})
        self._clock = clock
        # The watchdog repeats a timeout when its thread ends, possibly in a later read.
        self._seen: deque[tuple[str, ...]] = deque(maxlen=4096)
        self.dropped: Counter[str] = Counter()

    def collect(self) -> list[Sample]:
        text = self._tail.read_lines()
        self.dropped.update(self._tail.dropped)
        self._tail.dropped.clear()
        parsed = parse_watchdog_log(text, time=self._clock())
        self.dropped.update(parsed.dropped)
        samples = []
        for event in parsed.events:
            key = _key(event)
            if key in self._seen:
                continue
            self._seen.append(key)
            samples.append(
                Sample(event.kind, event.value, event.time, {**self._labels, **event.labels})
            )
        return samples
