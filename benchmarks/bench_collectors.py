"""Cost of the collector's parsers against the bare library call they wrap, in one process.

- exporter text: ``parse_exposition`` (label normalisation, NaN/sentinel drops, XID events)
  against prometheus_client's ``text_string_to_metric_families`` alone, on an 8-GPU
  dcgm-exporter scrape built from the 4.x fixture;
- flight-recorder pickle: ``load_flight_record`` (restricted unpickler and validation)
  against a bare ``pickle.loads`` of the same trusted bytes.

Run from the repository root: ``python benchmarks/bench_collectors.py``.
"""

from __future__ import annotations

import pickle
import re
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from collector.nccl import load_flight_record
from collector.promtext import XidTracker, parse_exposition

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"


def eight_gpu_scrape() -> str:
    """The 2-GPU fixture widened to 8 GPUs (GPUs 2..7 copy GPUs 0..1 with new ids)."""
    text = (FIXTURES / "telemetry" / "dcgm-exporter-4.1-h100-xid79.prom").read_text()
    lines = []
    for line in text.splitlines():
        lines.append(line)
        if line.startswith("#"):
            continue
        for extra in range(1, 4):
            lines.append(
                re.sub(r'gpu="(\d)"', lambda m, e=extra: f'gpu="{int(m[1]) + 2 * e}"', line)
            )
    return "\n".join(lines) + "\n"


def paired_medians(
    base: Callable[[], object], ours: Callable[[], object], repeats: int
) -> tuple[float, float]:
    """Median seconds of each, timed alternately so both see the same machine load."""
    for _ in range(10):  # warm up
        base()
        ours()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for fn, out in ((base, times[0]), (ours, times[1])):
            start = time.perf_counter()
            fn()
            out.append(time.perf_counter() - start)
    return statistics.median(times[0]), statistics.median(times[1])


def main() -> None:
    scrape = eight_gpu_scrape()
    series = sum(1 for line in scrape.splitlines() if line and not line.startswith("#"))
    tracker = XidTracker()
    base, ours = paired_medians(
        lambda: list(text_string_to_metric_families(scrape)),
        lambda: parse_exposition(scrape, time=0.0, tracker=tracker),
        repeats=300,
    )
    print(
        f"exporter text, {series} series: prometheus_client {base * 1e3:.2f} ms, "
        f"parse_exposition {ours * 1e3:.2f} ms, ratio {ours / base:.2f}"
    )

    dump = (FIXTURES / "nccl" / "nccl_trace_rank_0").read_bytes()
    base, ours = paired_medians(
        lambda: pickle.loads(dump), lambda: load_flight_record(dump, rank=0), repeats=3000
    )
    print(
        f"flight-recorder dump, {len(dump)} bytes: pickle.loads {base * 1e6:.1f} us, "
        f"load_flight_record {ours * 1e6:.1f} us, ratio {ours / base:.2f}"
    )


if __name__ == "__main__":
    main()
