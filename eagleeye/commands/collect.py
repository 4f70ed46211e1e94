"""`eagleeye collect SOURCE`: show what Eagle Eye reads from a URL or a file, as a table."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "collect",
        help="show what Eagle Eye reads from an exporter, a Prometheus server or a file",
        description=(
            "Reads SOURCE once and prints the samples, events and dropped input Eagle Eye gets "
            "from it. SOURCE is an exporter's metrics URL (http://host:9400/metrics), a "
            "Prometheus server with --query, or a file: exporter text, a kernel log (XIDs), "
            "an NCCL/training log (watchdog timeouts) or a flight-recorder dump. A folder of "
            "dumps (one per rank) is analysed together to name the ranks left behind. The kind "
            "of a file is sniffed from its content unless --kind is given."
        ),
    )
    p.add_argument("source", metavar="SOURCE", help="URL, file or folder")
    p.add_argument(
        "--kind", choices=_kinds(), default=None, help="what SOURCE is (default: sniffed)"
    )
    p.add_argument(
        "--query",
        default=None,
        metavar="PROMQL",
        help="PromQL instant query; makes SOURCE a Prometheus server's URL",
    )
    p.add_argument(
        "--limit", type=int, default=50, help="rows of samples to print (default: 50; 0 for all)"
    )
    p.add_argument(
        "--timeout", type=float, default=10.0, help="seconds to wait for a URL (default: 10)"
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object per sample and event instead of tables",
    )
    p.set_defaults(func=_collect)


def _kinds() -> tuple[str, ...]:
    from collector.sniff import KINDS

    return KINDS


def _collect(args: argparse.Namespace) -> int:
    from collector.sniff import read_source

    kind, parsed = read_source(args.source, kind=args.kind, query=args.query, timeout=args.timeout)
    if args.json:
        for sample in parsed.samples:
            print(json.dumps({"sample": sample.to_json()}))
        for event in parsed.events:
            print(json.dumps({"event": event.to_json()}))
        print(json.dumps({"dropped": dict(parsed.dropped)}))
        return 0
    _print_tables(args.source, kind, parsed, args.limit)
    return 0


def _print_tables(source: str, kind: str, parsed: Any, limit: int) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(file=sys.stdout, width=max(Console().width, 120))
    shown = parsed.samples if limit <= 0 else parsed.samples[:limit]
    if parsed.samples:
        table = Table(title=f"{len(parsed.samples)} samples from {source} ({kind})")
        for column in ("name", "value", "labels"):
            table.add_column(column, overflow="fold")
        for s in shown:
            table.add_row(s.name, f"{s.value:g}", _labels(s.labels))
        console.print(table)
        if len(shown) < len(parsed.samples):
            console.print(f"... {len(parsed.samples) - len(shown)} more (--limit 0 shows all)")
    if parsed.events:
        table = Table(title=f"{len(parsed.events)} events")
        for column in ("kind", "value", "where", "message"):
            table.add_column(column, overflow="fold")
        for e in parsed.events:
            table.add_row(e.kind, f"{e.value:g}", _labels(e.labels), e.message)
        console.print(table)
    if not parsed.samples and not parsed.events:
        console.print(f"nothing Eagle Eye uses in {source} ({kind})")
    dropped = ", ".join(f"{k}: {v}" for k, v in sorted(parsed.dropped.items())) or "none"
    console.print(f"dropped: {dropped}")


def _labels(labels: Any) -> str:
    return " ".join(f"{k}={v}" for k, v in labels.items())
