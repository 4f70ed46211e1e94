"""Reads any source Eagle Eye understands, telling its kind from the content if need be.

Used by ``eagleeye collect`` to show a user what Eagle Eye reads from a URL or a file:

- ``http(s)://...`` with a query: a Prometheus server (instant query);
- ``http(s)://...`` without one: an exporter's metrics page (dcgm-exporter, node-exporter);
- a file or folder: exporter text, a kernel log, an NCCL/training log, or flight-recorder
  dumps (a folder of dumps, one per rank, is analysed together to name missing ranks).
"""

from __future__ import annotations

import time as _time
from collections.abc import Callable
from pathlib import Path

from collector.errors import ParseError
from collector.events import Parsed
from collector.exporter import fetch_text
from collector.kmsg import parse_kmsg
from collector.nccl import load_flight_record, rank_from_filename
from collector.nccl_hang import flight_record_events
from collector.nccl_log import parse_watchdog_log
from collector.prometheus_api import PrometheusClient
from collector.promtext import XidTracker, parse_exposition

KINDS = ("exporter", "kernel-log", "nccl-log", "flight-recorder", "prometheus")
_LOG_READERS: dict[str, Callable[..., Parsed]] = {
    "kernel-log": parse_kmsg,
    "nccl-log": parse_watchdog_log,
}
#: Files larger than this are refused: none of these formats comes that large.
MAX_FILE_BYTES = 512 * 1024 * 1024


def read_source(
    source: str,
    *,
    kind: str | None = None,
    query: str | None = None,
    timeout: float = 10.0,
    time: float | None = None,
) -> tuple[str, Parsed]:
    """Reads ``source`` (a URL, a file or a folder) and returns (kind, what it holds).

    Args:
        source: ``http(s)://`` URL, file or folder.
        kind: one of :data:`KINDS`; sniffed from the content when None.
        query: PromQL for a Prometheus server (implies ``kind="prometheus"``).
        timeout: seconds to wait for a URL.
        time: time given to samples and events without their own; now by default.

    Raises:
        CollectorError: an unknown kind, an unreachable URL, a refused query, a missing
            file, or a file whose kind cannot be told (the message suggests ``--kind``).
    """
    now = _time.time() if time is None else time
    if kind is not None and kind not in KINDS:
        raise ParseError(f"unknown kind {kind!r}; known kinds: {', '.join(KINDS)}")
    if query is not None or kind == "prometheus":
        return "prometheus", _prometheus(source, query, timeout)
    if source.startswith(("http://", "https://")):
        text = fetch_text(source, timeout=timeout)
        return "exporter", parse_exposition(text, time=now, tracker=XidTracker(report_initial=True))
    return _read_path(Path(source), kind, now)


def _prometheus(source: str, query: str | None, timeout: float) -> Parsed:
    if not query:
        raise ParseError("a Prometheus server needs a query: pass --query 'PROMQL'")
    return Parsed(samples=tuple(PrometheusClient(source, timeout=timeout).query(query)))


def _read_path(path: Path, kind: str | None, now: float) -> tuple[str, Parsed]:
    if path.is_dir():
        return "flight-recorder", _dumps(_dump_files(path), now)
    data = _read_bytes(path)
    sniffed = kind is None
    kind = kind or sniff_kind(data, path.name)
    if kind == "flight-recorder":
        return kind, _dumps([path], now, data)
    text = data.decode("utf-8", "replace")
    if kind in _LOG_READERS:
        # A sniffed log may be a node's whole console: read it for XIDs and timeouts both.
        readers = _LOG_READERS.values() if sniffed else [_LOG_READERS[kind]]
        return kind, Parsed.merge(read(text, time=now) for read in readers)
    return "exporter", parse_exposition(text, time=now, tracker=XidTracker(report_initial=True))


def _read_bytes(path: Path) -> bytes:
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise ParseError(f"{path} is {size} bytes, more than {MAX_FILE_BYTES}; cut it first")
        return path.read_bytes()
    except OSError as exc:
        raise ParseError(f"cannot read {path}: {exc.strerror or exc}") from exc


def _dump_files(folder: Path) -> list[Path]:
    """The flight-recorder dumps in a folder, one per rank (a pickle and its JSON twin are
    the same dump; the first in name order is kept)."""
    by_rank: dict[int | None, Path] = {}
    for path in sorted(folder.iterdir()):
        if not path.is_file() or path.name.startswith("."):
            continue
        with path.open("rb") as f:
            head = f.read(4096)
        if _is_dump(head, path.name):
            by_rank.setdefault(rank_from_filename(path.name), path)
    if not by_rank:
        raise ParseError(f"folder {folder} holds no flight-recorder dumps")
    return list(by_rank.values())


def _dumps(paths: list[Path], now: float, data: bytes | None = None) -> Parsed:
    """Flight-recorder dumps of several ranks, analysed together."""
    records = []
    for path in paths:
        try:
            raw = data if data is not None else _read_bytes(path)
            records.append(load_flight_record(raw, rank=rank_from_filename(path.name)))
        except ParseError as exc:
            raise ParseError(f"{path}: {exc}") from exc
    return flight_record_events(records, time=now)


def sniff_kind(data: bytes, name: str = "") -> str:
    """The kind of a file, from its first bytes (and its name for dumps).

    Raises:
        ParseError: nothing in the content says what it is.
    """
    head = data[:65536]
    if _is_dump(head, name):
        return "flight-recorder"
    if b"NVRM: Xid" in data:
        return "kernel-log"
    if b"collective operation timeout" in data or b"ProcessGroupNCCL" in data:
        return "nccl-log"
    text = head.decode("utf-8", "replace")
    if parse_exposition(text, time=0.0).samples:
        return "exporter"
    raise ParseError(
        f"cannot tell what {name or 'this file'} is; pass --kind (one of {', '.join(KINDS)})"
    )


def _is_dump(head: bytes, name: str) -> bool:
    if head[:1] == b"\x80":
        return True  # a pickle: the only pickles we read are flight-recorder dumps
    json_object = head.lstrip()[:1] == b"{"
    return json_object and (b'"version"' in head or name.startswith("nccl_trace_rank_"))
