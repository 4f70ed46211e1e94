from __future__ import annotations

import math
from collections import deque
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from collector.exporter import ExporterSource
from collector.promtext import XidTracker, normalise_labels, parse_exposition

GPU0 = 'gpu="0",UUID="GPU-a",Hostname="n1"'


def _read(fixtures: Path, name: str) -> str:
    return (fixtures / "telemetry" / name).read_text()


def test_dcgm_3x_fixture_reads_every_series_and_drops_the_sentinel(fixtures: Path) -> None:
    parsed = parse_exposition(_read(fixtures, "dcgm-exporter-3.3-h100.prom"), time=7.0)
    names = {s.name for s in parsed.samples}
    assert "DCGM_FI_DEV_GPU_UTIL" in names
    assert "DCGM_FI_DEV_XID_ERRORS" not in names  # the sticky gauge is never a level
    temps = {
        s.labels["gpu"]: s.value for s in parsed.samples if s.name == "DCGM_FI_DEV_MEMORY_TEMP"
    }
    assert temps == {"0": 44.0}  # GPU 1 reported the 9.2e18 blank
    assert parsed.dropped == {"dcgm_sentinel": 1}
    assert parsed.events == ()
    first = parsed.samples[0]
    assert first.labels["node"] == "gpu-node-07"
    assert first.labels["uuid"].startswith("GPU-")
    assert first.time == 7.0


def test_dcgm_4x_fixture_gives_one_xid_event_and_counts_nan_and_sentinel(fixtures: Path) -> None:
    parsed = parse_exposition(_read(fixtures, "dcgm-exporter-4.1-h100-xid79.prom"), time=7.0)
    assert len(parsed.events) == 1  # gauge and windowed count report the same XID once
    event = parsed.events[0]
    assert (event.kind, event.value) == ("gpu_xid", 79.0)
    assert event.labels["gpu"] == "1"
    assert event.labels["node"] == "gpu-node-07"
    assert event.labels["severity"] == "fatal"
    assert parsed.dropped == {"nan": 1, "dcgm_sentinel": 1}
    # the family without HELP/TYPE is still read
    assert any(s.name == "DCGM_FI_DEV_FB_RESERVED" for s in parsed.samples)


def test_hostname_drift_gives_the_same_node_label(fixtures: Path) -> None:
    old = parse_exposition(_read(fixtures, "dcgm-exporter-3.3-h100.prom"), time=0.0)
    new = parse_exposition(_read(fixtures, "dcgm-exporter-4.1-h100-xid79.prom"), time=0.0)
    assert {s.labels["node"] for s in old.samples} == {s.labels["node"] for s in new.samples}
    assert normalise_labels({"Hostname": "a"}) == normalise_labels({"hostname": "a"})


def test_node_exporter_text_is_read(fixtures: Path) -> None:
    parsed = parse_exposition(_read(fixtures, "node-exporter.prom"), time=1.0, labels={"node": "n"})
    errs = {
        s.labels["device"]: s.value
        for s in parsed.samples
        if s.name == "node_network_receive_errs_total"
    }
    assert errs == {"ib0": 3.0, "eth0": 0.0}
    assert all(s.labels["node"] == "n" for s in parsed.samples)
    assert parsed.total_dropped == 0


def test_xid_gauge_fires_on_change_only() -> None:
    tracker = XidTracker(report_initial=False)
    codes = []
    for value in (13, 13, 0, 79, 79, 79, 48):
        text = f"DCGM_FI_DEV_XID_ERRORS{{{GPU0}}} {value}\n"
        codes += [e.value for e in parse_exposition(text, time=0.0, tracker=tracker).events]
    # the first 13 predates the tracker; 0 is no XID; 79 repeats are one event
    assert codes == [79.0, 48.0]


def test_xid_count_fires_on_each_rise() -> None:
    tracker = XidTracker(report_initial=True)
    counts = []
    for value in (1, 1, 3, 0, 2):
        text = f'DCGM_EXP_XID_ERRORS_COUNT{{{GPU0},xid="94"}} {value}\n'
        counts += [
            e.labels["count"] for e in parse_exposition(text, time=0.0, tracker=tracker).events
        ]
    assert counts == ["1", "2", "2"]


def test_malformed_lines_cost_only_themselves() -> None:
    text = 'ok 1\nbroken{a="1" 2\n\x00\x01garbage\nalso_ok{a="x"} 2.5 1700000000000\nx{} NaN\n'
    parsed = parse_exposition(text, time=3.0)
    assert [(s.name, s.value) for s in parsed.samples] == [("ok", 1.0), ("also_ok", 2.5)]
    assert parsed.samples[1].time == 1700000000.0
    assert parsed.dropped == {"malformed_line": 2, "nan": 1}


def test_huge_label_set_is_dropped_and_counted() -> None:
    labels = ",".join(f'l{i}="{i}"' for i in range(200))
    parsed = parse_exposition(f"wide{{{labels}}} 1\nnarrow 2\n", time=0.0)
    assert [s.name for s in parsed.samples] == ["narrow"]
    assert parsed.dropped == {"too_many_labels": 1}


def test_long_label_values_are_bounded() -> None:
    parsed = parse_exposition(f'm{{a="{"x" * 10000}"}} 1\n', time=0.0)
    assert len(parsed.samples[0].labels["a"]) <= 256


def test_exporter_source_counts_a_failed_scrape_and_goes_on() -> None:
    texts = iter(["a 1\n", OSError("connection refused"), "a 2\n"])

    def fetch() -> str:
        item = next(texts)
        if isinstance(item, Exception):
            raise item
        return item

    source = ExporterSource(fetch, clock=lambda: 1.0)
    values = [[s.value for s in source.collect()] for _ in range(3)]
    assert values == [[1.0], [], [2.0]]
    assert source.dropped["scrape_error"] == 1


def test_exporter_source_reports_an_xid_that_appears_after_it_started() -> None:
    texts = iter([f"DCGM_FI_DEV_XID_ERRORS{{{GPU0}}} {v}\n" for v in (31, 31, 79)])
    source = ExporterSource(lambda: next(texts), clock=lambda: 1.0)
    seen = [[s.value for s in source.collect() if s.name == "gpu_xid"] for _ in range(3)]
    assert seen == [[], [], [79.0]]
    assert [e.value for e in source.events] == [79.0]


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=400))
def test_any_text_parses_without_raising(text: str) -> None:
    parsed = parse_exposition(text, time=0.0)
    assert all(math.isfinite(s.value) for s in parsed.samples)
    assert all(v > 0 for v in parsed.dropped.values())


_name = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,20}", fullmatch=True)
_value = st.floats(allow_nan=True, allow_infinity=True)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(_name, _value, st.dictionaries(_name, st.text(max_size=20), max_size=5)),
        max_size=10,
    )
)
def test_well_formed_series_are_kept_or_counted(
    series: list[tuple[str, float, dict[str, str]]],
) -> None:
    lines = []
    for name, value, labels in series:
        body = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
        lines.append(f"{name}{{{body}}} {value!r}".replace("nan", "NaN").replace("inf", "Inf"))
    parsed = parse_exposition("\n".join(lines) + "\n", time=0.0)
    # every line is either a sample, an event, or a counted drop
    assert len(parsed.samples) + len(parsed.events) + parsed.total_dropped >= len(
        [
            n
            for n, _, _ in series
            if n not in ("DCGM_FI_DEV_XID_ERRORS", "DCGM_EXP_XID_ERRORS_COUNT")
        ]
    )


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def test_exporter_source_from_url_scrapes_a_live_exporter(exporter: int) -> None:
    source = ExporterSource.from_url(f"http://127.0.0.1:{exporter}/metrics", labels={"x": "1"})
    temps = {s.labels["gpu"]: s.value for s in source.collect() if s.name == "ee_test_gpu_temp"}
    assert temps == {"0": 41.0, "1": 77.0}
    assert source.events == deque()  # the XID predates the source: not reported
