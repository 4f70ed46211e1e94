"""A dcgm-exporter stand-in: a real HTTP server whose ``/metrics`` is exporter text for
every field of dcgm-exporter's default counter list (tests/fixtures/telemetry), with the
label set of the 3.x releases, for a few GPUs whose values a test changes while it runs."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

COUNTERS = (
    Path(__file__).resolve().parents[1]
    / "fixtures"
    / "telemetry"
    / "dcgm-exporter-default-counters.csv"
)
#: Typical values of a training GPU; every other listed field reads 1.
TYPICAL = {
    "DCGM_FI_DEV_SM_CLOCK": 1980.0,
    "DCGM_FI_DEV_MEM_CLOCK": 2619.0,
    "DCGM_FI_DEV_GPU_TEMP": 52.0,
    "DCGM_FI_DEV_MEMORY_TEMP": 48.0,
    "DCGM_FI_DEV_POWER_USAGE": 412.5,
    "DCGM_FI_DEV_GPU_UTIL": 97.0,
    "DCGM_FI_DEV_FB_USED": 70000.0,
    "DCGM_FI_DEV_FB_FREE": 11000.0,
    "DCGM_FI_DEV_XID_ERRORS": 0.0,
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": 0.0,
}


def counter_list(path: Path = COUNTERS) -> list[tuple[str, str, str]]:
    """(field, Prometheus type, help) of every field the list enables."""
    fields = []
    for line in path.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, kind, help_text = (part.strip() for part in line.split(",", 2))
        if kind in ("gauge", "counter"):
            fields.append((name, kind, help_text))
    return fields


class FakeDcgmExporter:
    """Exporter text for ``gpus`` GPUs of host ``hostname``; ``values[gpu][field]`` may be
    changed at any time (the next scrape shows it)."""

    def __init__(self, hostname: str, gpus: int = 2) -> None:
        self.hostname = hostname
        self.fields = counter_list()
        self.values: list[dict[str, float]] = [dict(TYPICAL) for _ in range(gpus)]
        self.scrapes = 0

    def uuid(self, gpu: int) -> str:
        return f"GPU-dcgm-{gpu:04d}"

    def text(self) -> str:
        lines: list[str] = []
        listed = {name for name, _, _ in self.fields}
        # a field the test sets beyond the list (throttle reasons, ECC) is one a user enabled
        enabled = [(n, "gauge", n) for n in sorted(set().union(*self.values)) if n not in listed]
        for name, kind, help_text in [*self.fields, *enabled]:
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
            for gpu, values in enumerate(self.values):
                labels = (
                    f'gpu="{gpu}",UUID="{self.uuid(gpu)}",device="nvidia{gpu}",'
                    f'modelName="NVIDIA H100 80GB HBM3",Hostname="{self.hostname}"'
                )
                lines.append(f"{name}{{{labels}}} {values.get(name, 1.0):g}")
        return "\n".join(lines) + "\n"

    def set(self, gpu: int, field: str, value: float) -> None:
        for values in self.values:  # a field exists on every GPU once one has it
            values.setdefault(field, 0.0)
        self.values[gpu][field] = value


@contextmanager
def serving(exporter: FakeDcgmExporter) -> Iterator[str]:
    """Serves ``exporter`` on a free loopback port; yields its /metrics URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            body = exporter.text().encode()
            exporter.scrapes += 1
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/metrics"
    finally:
        server.shutdown()
        server.server_close()
