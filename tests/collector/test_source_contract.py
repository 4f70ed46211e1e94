"""One contract every Source of the collector keeps (house style: one suite, every plugin)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from collector import (
    DumpFolderSource,
    ExporterSource,
    HostSource,
    KernelLogSource,
    NvmlPoller,
    Sample,
    Source,
    WatchdogLogSource,
)
from collector.testing import FakeNVML, FakeSource

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _exporter(tmp: Path) -> Source:
    text = (FIXTURES / "telemetry" / "dcgm-exporter-4.1-h100-xid79.prom").read_text()
    return ExporterSource(lambda: text)


def _kmsg(tmp: Path) -> Source:
    return KernelLogSource(FIXTURES / "telemetry" / "kmsg-xid.log")


def _watchdog(tmp: Path) -> Source:
    return WatchdogLogSource(FIXTURES / "telemetry" / "nccl-watchdog.log")


def _dumps(tmp: Path) -> Source:
    return DumpFolderSource(FIXTURES / "nccl")


SOURCES: dict[str, Callable[[Path], Source]] = {
    "exporter": _exporter,
    "kernel-log": _kmsg,
    "watchdog-log": _watchdog,
    "dump-folder": _dumps,
    "host": lambda tmp: HostSource(node="n1"),
    "nvml": lambda tmp: NvmlPoller(node="n1", nvml=FakeNVML(gpus=2)),
    "fake": lambda tmp: FakeSource([[Sample("x", 1.0, 0.0)]]),
}


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_source_contract(name: str, tmp_path: Path) -> None:
    source = SOURCES[name](tmp_path)
    assert isinstance(source, Source)
    batches = [list(source.collect()) for _ in range(3)]  # state carries between collects
    assert batches[0], "every source here has something to read at first"
    for s in (s for batch in batches for s in batch):
        assert isinstance(s, Sample)
        assert s.name
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in s.labels.items())
        assert Sample.from_json(json.loads(json.dumps(s.to_json()))).name == s.name
