"""What the flight-recorder dumps of all ranks say together: who is stuck, who is missing.

In a collective hang, the ranks that entered the collective wait in it (their dumps show
it pending), and the rank that never entered it has a last sequence number behind
theirs on that process group. Naming that rank is what lets remediation isolate the
right replica or node instead of restarting everything.
"""

from __future__ import annotations

import os
import time as _time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from collector.errors import ParseError
from collector.events import Event, Parsed, clean_label
from collector.nccl import CollectiveRecord, FlightRecord, read_flight_record
from collector.types import Sample


def flight_record_events(records: Sequence[FlightRecord], *, time: float) -> Parsed:
    """What a set of dumps (one per rank) says: pending collectives and ranks left behind.

    Returns:
        ``nccl_pending_collective`` events (one per collective a rank is waiting on; value =
        sequence number), ``nccl_rank_behind`` events (a rank whose last collective on a
        process group is behind the others'; value = the sequence number it never
        entered), ``nccl_last_seq`` samples per rank and group, and drops
        (``malformed_entry``).
    """
    events = [_pending_event(r, e, time) for r in records for e in r.entries if e.pending]
    events += _behind_events(records, time)
    samples = [
        Sample("nccl_last_seq", float(seq), time, {**_rank_label(r), "pg_id": pg})
        for r in records
        for pg, seq in sorted(r.last_entered().items())
    ]
    dropped = sum(r.dropped for r in records)
    return Parsed(tuple(samples), tuple(events), {"malformed_entry": dropped} if dropped else {})


def _rank_label(record: FlightRecord) -> dict[str, str]:
    return {} if record.rank is None else {"rank": str(record.rank)}


def _pending_event(record: FlightRecord, e: CollectiveRecord, time: float) -> Event:
    labels = {**_rank_label(record), **_pg_labels(e), "op": e.op, "state": e.state}
    if e.timeout_ms is not None:
        labels["timeout_ms"] = str(e.timeout_ms)
    who = f"rank {record.rank}" if record.rank is not None else "a rank"
    message = f"{who} waits in {e.op} #{e.seq} of process group {e.pg_name or e.pg_id}"
    return Event("nccl_pending_collective", time, float(e.seq), labels, message)


def _pg_labels(e: CollectiveRecord) -> dict[str, str]:
    return {"pg_id": e.pg_id, "process_group": e.pg_name, "pg_desc": e.pg_desc}


def _behind_events(records: Sequence[FlightRecord], time: float) -> list[Event]:
    ranked = [r for r in records if r.rank is not None]
    last = {r.rank: r.last_entered() for r in ranked}
    events = []
    for pg in sorted({pg for seqs in last.values() for pg in seqs}):
        members = _members(ranked, pg, last)
        lead = max(last[rank].get(pg, 0) for rank in members)
        leaders = sorted(rank for rank in members if last[rank].get(pg, 0) == lead)
        entry = _entry_at(ranked, pg, lead)
        for rank in sorted(members):
            seq = last[rank].get(pg, 0)
            if seq < lead and rank is not None:
                events.append(_behind_event(rank, pg, seq, leaders, entry, time))
    return events


def _members(
    ranked: Sequence[FlightRecord], pg: str, last: Mapping[Any, dict[str, int]]
) -> set[Any]:
    """Ranks to compare on a group: those that recorded it, plus its configured members."""
    members = {r.rank for r in ranked if pg in last[r.rank]}
    names = {e.pg_name for r in ranked for e in r.entries if e.pg_id == pg}
    for r in ranked:
        for name in names:
            if r.rank in r.pg_ranks.get(name, ()):
                members.add(r.rank)
    return members


def _entry_at(records: Sequence[FlightRecord], pg: str, seq: int) -> CollectiveRecord | None:
    for r in records:
        for e in r.entries:
            if e.pg_id == pg and e.seq == seq and not e.is_p2p:
                return e
    return None


def _behind_event(
    rank: int, pg: str, seq: int, leaders: list[Any], entry: CollectiveRecord | None, time: float
) -> Event:
    missing = seq + 1
    labels = {"rank": str(rank), "pg_id": pg, "last_seq": str(seq)}
    labels["ahead_ranks"] = clean_label(",".join(str(r) for r in leaders))
    if entry is not None:
        labels.update(_pg_labels(entry))
        labels["op"] = entry.op
    what = f"{entry.op} #{entry.seq}" if entry is not None else f"collective #{missing}"
    message = (
        f"rank {rank} is behind on process group {pg}: its last collective is #{seq}, while "
        f"ranks {labels['ahead_ranks']} entered {what}"
    )
    return Event("nccl_rank_behind", time, float(missing), labels, message)


class DumpFolderSource:
    """Watches the folder ranks dump into and reports what the dumps say, once each.

    Point ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE`` (or ``TORCH_FR_DUMP_TEMP_FILE``) of every rank
    at ``<folder>/nccl_trace_rank_``. Each ``collect()`` re-reads the folder when a dump
    appeared or changed, analyses the latest dump of every rank together and yields the
    events not yielded before. An unreadable dump is counted, not raised.

    Args:
        folder: where the dumps land.
        prefix: the file-name prefix of a dump (before the rank).
        clock: seconds since the epoch, injected for tests.
    """

    def __init__(
        self,
        folder: str | os.PathLike[str],
        *,
        prefix: str = "nccl_trace_rank_",
        clock: Callable[[], float] = _time.time,
    ) -> None:
        self.folder = Path(folder)
        self.prefix = prefix
        self._clock = clock
        self._stamps: dict[str, tuple[float, int]] = {}
        self._seen: set[tuple[str, ...]] = set()
        self.dropped: Counter[str] = Counter()

    def collect(self) -> list[Sample]:
        stamps = self._scan()
        if stamps == self._stamps:
            return []
        self._stamps = stamps
        records = []
        for name in sorted(stamps):
            try:
                records.append(read_flight_record(self.folder / name))
            except ParseError:
                self.dropped["unreadable_dump"] += 1
        parsed = flight_record_events(_one_per_rank(records), time=self._clock())
        self.dropped.update(parsed.dropped)
        fresh = []
        for event in parsed.events:
            where = (f"{k}={v}" for k, v in sorted(event.labels.items()))
            key = (event.kind, str(event.value), *where)
            if key not in self._seen:
                self._seen.add(key)
                fresh.append(event.to_sample())
        return fresh

    def _scan(self) -> dict[str, tuple[float, int]]:
        stamps = {}
        try:
            for entry in os.scandir(self.folder):
                if entry.is_file() and entry.name.startswith(self.prefix):
                    stat = entry.stat()
                    stamps[entry.name] = (stat.st_mtime, stat.st_size)
        except OSError:
            self.dropped["read_error"] += 1
        return stamps


def _one_per_rank(records: list[FlightRecord]) -> list[FlightRecord]:
    """One record per rank (a pickle and its JSON twin are the same dump)."""
    by_rank: dict[int | None, FlightRecord] = {}
    for record in records:
        by_rank.setdefault(record.rank, record)
    return list(by_rank.values())
