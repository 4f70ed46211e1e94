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
import math
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


MAX_ENTRIES = 1 << 16  # the recorder keeps 2000 by default; more are counted as dropped
MAX_GROUPS = 1 << 12
MAX_RANKS_TEXT = 1 << 20


def _record(raw: dict[str, Any], rank: int | None) -> FlightRecord:
    entries: list[CollectiveRecord] = []
    items = _as_list(raw.get("entries"))
    dropped = max(0, len(items) - MAX_ENTRIES)
    for item in items[:MAX_ENTRIES]:
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
        version=_label(raw.get("version")),
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
    name, desc = (_label(item.get("pg_id", "")), "")
    if isinstance(group, list | tuple) and len(group) == 2:
        name, desc = group[0], group[1]
    pg_id, seq = _int_or_none(item.get("pg_id")), _int_or_none(item.get("collective_seq_id"))
    if pg_id is None or seq is None:
        return None
    try:
        return CollectiveRecord(
            pg_id=str(pg_id),
            pg_name=_label(name),
            pg_desc=_label(desc),
            seq=seq,
            op=_label(item.get("profiling_name", "")),
            state=_label(item.get("state", "")),
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
    for name, info in list(config.items())[:MAX_GROUPS]:
        if not isinstance(info, dict) or not isinstance(name, str | int) or not name:
            continue
        ranks = _ranks(info.get("ranks", ""))
        if ranks:
            result[_label(name)] = ranks
    return result


def _ranks(value: Any) -> tuple[int, ...]:
    """Member ranks from ``"[0, 1]"`` (or a list of ints); bounded, junk ignored."""
    if isinstance(value, list | tuple):
        value = ",".join(str(v) for v in value[:MAX_RANKS_TEXT] if _int_or_none(v) is not None)
    if not isinstance(value, str) or len(value) > MAX_RANKS_TEXT:
        return ()
    return tuple(int(r) for r in re.findall(r"\d{1,9}", value))


def _label(value: Any) -> str:
    """A dump's text field as a bounded label; containers (whose text a pickle's shared
    references can make enormous) and numbers beyond 64 bits become ``?``."""
    if isinstance(value, str):
        return clean_label(value[:MAX_RANKS_TEXT])
    if value is None or isinstance(value, bool | float):
        return clean_label(value)
    if isinstance(value, int) and -(2**63) <= value < 2**63:
        return str(value)
    return "?"


def _status(status: Mapping[Any, Any], key: str) -> dict[str, int]:
    result = {}
    for pg, info in list(status.items())[:MAX_GROUPS]:
        value = _int_or_none(info.get(key)) if isinstance(info, dict) else None
        if value is not None:
            result[_label(pg)] = value
    return result


def _int_or_none(value: Any) -> int | None:
    """A 64-bit integer from an int or a short decimal string, else None."""
    if isinstance(value, str) and len(value) <= 20:
        try:
            value = int(value)
        except ValueError:
            return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not -(2**63) <= value < 2**63:
        return None
    return value


def _float_or_none(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        number = float(value[:64] if isinstance(value, str) else value)
    except (TypeError, ValueError, OverflowError):
        return None
    return number if math.isfinite(number) else None
