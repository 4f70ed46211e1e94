"""What the flight-recorder dumps of all ranks say together: who is stuck, who is missing.

In a collective hang, the ranks that entered the collective wait in it (their dumps show
it pending), and the rank that never entered it has a last sequence number behind
theirs on that process group. Naming that rank is what lets remediation isolate the
right replica or node instead of restarting everything.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from collector.events import Event, Parsed, clean_label
from collector.nccl import CollectiveRecord, FlightRecord
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
