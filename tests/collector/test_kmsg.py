from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.kmsg import KernelLogSource, parse_kmsg
from collector.xid import XID_CATALOGUE, lookup

LINE = "[ 10.5] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, GPU has fallen off the bus."


def test_fixture_gives_every_xid_with_pci_code_and_severity(fixtures: Path) -> None:
    text = (fixtures / "telemetry" / "kmsg-xid.log").read_text()
    parsed = parse_kmsg(text, time=5.0, node="gpu-node-07", pci_to_gpu={"0000:3b:00": "1"})
    got = [(int(e.value), e.labels["pci"], e.labels["severity"]) for e in parsed.events]
    assert got == [
        (79, "0000:3b:00", "fatal"),
        (94, "0000:18:00", "fatal"),
        (48, "0000:18:00", "fatal"),
        (63, "0000:18:00", "warn"),
        (119, "0000:5e:00", "fatal"),
    ]
    first = parsed.events[0]
    assert first.labels["gpu"] == "1"  # mapped from the PCI id
    assert first.labels["node"] == "gpu-node-07"
    assert first.labels["pid"] == "48211"
    assert first.labels["process"] == "python"
    assert first.message == "GPU has fallen off the bus."
    assert parsed.events[1].labels["pid"] == "<unknown>"
    assert "gpu" not in parsed.events[1].labels  # PCI id not in the map
    assert parsed.dropped == {"malformed_xid": 1}  # the truncated line


def test_uptime_and_kmsg_stamps_become_times_with_a_boot_time() -> None:
    raw = "6,1,2500000,-;NVRM: Xid (PCI:0000:3b:00): 13, pid=1, Graphics Exception"
    parsed = parse_kmsg(f"{LINE}\n{raw}\n", time=5.0, boot_time=1000.0)
    assert [e.time for e in parsed.events] == [1010.5, 1002.5]
    assert [e.time for e in parse_kmsg(LINE, time=5.0).events] == [5.0]


def test_catalogue_covers_the_fatal_codes_of_the_fault_catalogue() -> None:
    for code in (79, 48, 94, 95, 119, 120, 154):
        assert XID_CATALOGUE[code].severity == "fatal"
    assert lookup(92).severity == "warn"
    assert lookup(999).name == "unknown XID 999"


def test_source_tails_the_file_and_reads_each_line_once(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("boot\n")
    source = KernelLogSource(log, node="n1", clock=lambda: 9.0)
    assert source.collect() == []
    with log.open("a") as f:
        f.write(LINE + "\n" + LINE[:30])  # the second line is still being written
    assert [s.value for s in source.collect()] == [79.0]
    with log.open("a") as f:
        f.write(LINE[30:] + "\n")
    assert [s.value for s in source.collect()] == [79.0]
    assert source.collect() == []
    log.write_text(LINE + "\n")  # rotated: smaller than what was read
    assert [s.labels["node"] for s in source.collect()] == ["n1"]


def test_source_counts_a_missing_file(tmp_path: Path) -> None:
    source = KernelLogSource(tmp_path / "absent.log")
    assert source.collect() == []
    assert source.dropped["read_error"] == 1


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_any_text_parses_without_raising(text: str) -> None:
    parsed = parse_kmsg(text, time=0.0, boot_time=0.0)
    assert all(e.kind == "gpu_xid" for e in parsed.events)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(min_value=0, max_value=99999),
    st.from_regex(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}", fullmatch=True),
    st.text(
        alphabet=st.characters(blacklist_characters="\r\n\x1c\x1d\x1e\x85\u2028\u2029\x0b\x0c"),
        max_size=80,
    ),
)
def test_any_well_formed_xid_line_is_read(code: int, pci: str, tail: str) -> None:
    parsed = parse_kmsg(f"[ 1.0] NVRM: Xid (PCI:{pci}): {code}, {tail}", time=0.0)
    assert [(int(e.value), e.labels["pci"]) for e in parsed.events] == [(code, pci)]


def test_a_huge_backlog_is_read_over_several_polls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import collector._tail as tail

    monkeypatch.setattr(tail, "MAX_CHUNK", 1000)
    log = tmp_path / "kern.log"
    log.write_text((LINE + "\n") * 30)  # about 2.7 kB
    source = KernelLogSource(log)
    counts = [len(source.collect()) for _ in range(5)]
    assert sum(counts) == 30
    assert counts[0] < 30


def test_an_endless_line_without_newline_is_dropped(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("x" * 20000)
    source = KernelLogSource(log)
    assert source.collect() == []
    assert source.dropped["line_too_long"] == 1
