"""PyTorch flight-recorder dumps into collective records and hang events.

PyTorch's flight recorder (``TORCH_FR_BUFFER_SIZE``; NCCL, and gloo in recent versions)
keeps the last collectives each rank issued and writes them on a timeout to
``TORCH_NCCL_DEBUG_INFO_TEMP_FILE`` + rank, as a pickle, or as JSON through
``_dump_fr_trace_json``. Both forms are read here; the pickle through a restricted loader
that refuses anything but containers and scalars.

One rank's dump says what it was waiting for; the dumps of all ranks together say who is
missing: a rank whose last collective on a process group is behind the others' never
entered the collective they are stuck in: :mod:`collector.nccl_hang` draws that
conclusion. The watchdog's log lines are read by :mod:`collector.nccl_log`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from collector._safe_pickle import safe_loads
from collector.errors import ParseError
from collector.events import clean_label

_RANK_IN_NAME = re.compile(r"(\d+)(?:\.json|\.pkl|\.pickle)?$")


@dataclass(frozen=True, slots=True)
class CollectiveRecord:
    """One collective as a rank's flight recorder saw it."""

    pg_id: str
    pg_name: str
    pg_desc: str
    seq: int
    op: str
    state: str
    retired: bool
    is_p2p: bool = False
    timeout_ms: int | None = None
    duration_ms: float | None = None

    @property
    def pending(self) -> bool:
        """Entered and neither completed nor retired: what the rank is waiting on."""
        return self.state != "completed" and not self.retired


@dataclass(frozen=True, slots=True)
class FlightRecord:
    """One rank's dump: its collectives, process-group membership and progress."""

    rank: int | None
    version: str
    entries: tuple[CollectiveRecord, ...]
    pg_ranks: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    last_enqueued: Mapping[str, int] = field(default_factory=dict)
    last_completed: Mapping[str, int] = field(default_factory=dict)
    dropped: int = 0

    def last_entered(self) -> dict[str, int]:
        """pg_id -> the highest collective sequence number this rank entered."""
        last = {pg: seq for pg, seq in self.last_enqueued.items() if seq >= 0}
        for e in self.entries:
            if not e.is_p2p:
                last[e.pg_id] = max(last.get(e.pg_id, 0), e.seq)
        return last


def load_flight_record(data: bytes, *, rank: int | None = None) -> FlightRecord:
    """Reads a dump in either form (JSON or pickle, sniffed from the first byte).

    Args:
        data: the file's bytes.
        rank: the rank that wrote it (dumps do not say; see :func:`rank_from_filename`).

    Raises:
        ParseError: not a dump at all (garbage, truncated, a pickle naming code, no
            ``version``). A malformed entry inside a good dump is counted in ``dropped``.
    """
    head = data.lstrip()[:1]
    if head == b"{":
        try:
            raw = json.loads(data)
        except (ValueError, RecursionError) as exc:
            raise ParseError(f"flight-recorder JSON is not valid JSON: {exc}") from exc
    elif data[:1] == b"\x80":
        raw = safe_loads(data)
    else:
        raise ParseError("not a flight-recorder dump: expected a JSON object or a pickle")
    if not isinstance(raw, dict) or "version" not in raw:
        raise ParseError("not a flight-recorder dump: no 'version' key at the top level")
    return _record(raw, rank)


def read_flight_record(path: str | Path) -> FlightRecord:
    """Reads a dump file; the rank comes from the file name (``nccl_trace_rank_3``)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ParseError(f"cannot read flight-recorder dump {path}: {exc}") from exc
    return load_flight_record(data, rank=rank_from_filename(path.name))


def rank_from_filename(name: str) -> int | None:
    """The rank suffix PyTorch appends to the dump file name, if there is one."""
    match = _RANK_IN_NAME.search(name)
    return int(match[1]) if match else None


def _record(raw: dict[str, Any], rank: int | None) -> FlightRecord:
    entries: list[CollectiveRecord] = []
    dropped = 0
    for item in _as_list(raw.get("entries")):
        entry = _entry(item)
        if entry is None:
            dropped += 1
        else:
            entries.append(entry)
    status = raw.get("pg_status")
    if not isinstance(status, dict):
        status = {}
    return FlightRecord(
        rank=rank,
        version=clean_label(raw.get("version")),
        entries=tuple(entries),
        pg_ranks=_pg_ranks(raw.get("pg_config")),
        last_enqueued=_status(status, "last_enqueued_collective"),
        last_completed=_status(status, "last_completed_collective"),
        dropped=dropped,
    )


def _entry(item: Any) -> CollectiveRecord | None:
    """One entry, or None when it lacks the fields that identify a collective."""
    if not isinstance(item, dict):
        return None
    group = item.get("process_group")
    name, desc = (str(item.get("pg_id", "")), "")
    if isinstance(group, list | tuple) and len(group) == 2:
        name, desc = group[0], group[1]
    try:
        return CollectiveRecord(
            pg_id=str(int(item["pg_id"])),
            pg_name=clean_label(name),
            pg_desc=clean_label(desc),
            seq=int(item["collective_seq_id"]),
            op=clean_label(item.get("profiling_name", "")),
            state=clean_label(item.get("state", "")),
            retired=bool(item.get("retired", False)),
            is_p2p=bool(item.get("is_p2p", False)),
            timeout_ms=_int_or_none(item.get("timeout_ms")),
            duration_ms=_float_or_none(item.get("duration_ms")),
        )
    except (KeyError, TypeError, ValueError, OverflowError):
        return None


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else []


def _pg_ranks(config: Any) -> dict[str, tuple[int, ...]]:
    """pg name -> member ranks, from ``pg_config`` (ranks is a string like ``"[0, 1]"``)."""
    result: dict[str, tuple[int, ...]] = {}
    if not isinstance(config, dict):
        return result
    for name, info in config.items():
        if not isinstance(info, dict) or not name:
            continue
        ranks = tuple(int(r) for r in re.findall(r"\d+", str(info.get("ranks", ""))))
        if ranks:
            result[str(name)] = ranks
    return result


def _status(status: Mapping[Any, Any], key: str) -> dict[str, int]:
    result = {}
    for pg, info in status.items():
        value = _int_or_none(info.get(key)) if isinstance(info, dict) else None
        if value is not None:
            result[str(pg)] = value
    return result


def _int_or_none(value: Any) -> int | None:
    try:
        return None if value is None or isinstance(value, bool) else int(value)
    except (TypeError, ValueError, OverflowError):
        return None


def _float_or_none(value: Any) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None
