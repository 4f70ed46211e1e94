from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.errors import ParseError
from collector.nccl import (
    load_flight_record,
    rank_from_filename,
    read_flight_record,
)
from collector.nccl_hang import DumpFolderSource, flight_record_events
from collector.nccl_log import WatchdogLogSource, parse_watchdog_log


def _dumps(fixtures: Path, suffix: str = "") -> list:
    return [
        read_flight_record(fixtures / "nccl" / f"nccl_trace_rank_{r}{suffix}") for r in range(3)
    ]


@pytest.mark.parametrize("suffix", ["", ".json"])
def test_real_hang_dumps_name_the_missing_rank_group_and_sequence(
    fixtures: Path, suffix: str
) -> None:
    records = _dumps(fixtures, suffix)
    assert [r.rank for r in records] == [0, 1, 2]
    assert records[0].version == "2.10"
    parsed = flight_record_events(records, time=1.0)
    behind = [e for e in parsed.events if e.kind == "nccl_rank_behind"]
    assert len(behind) == 1
    event = behind[0]
    assert event.labels["rank"] == "1"
    assert event.labels["pg_id"] == "0"
    assert event.labels["process_group"] == "0"
    assert event.labels["pg_desc"] == "default_pg"
    assert event.labels["op"] == "gloo:all_reduce"
    assert event.labels["ahead_ranks"] == "0,2"
    assert event.value == 5.0
    pending = sorted(
        (e.labels["rank"], e.value) for e in parsed.events if e.kind == "nccl_pending_collective"
    )
    assert pending == [("0", 5.0), ("2", 5.0)]
    # the sub-group [0, 2] that rank 1 never joined is not held against it
    assert not any(e.labels.get("pg_id") == "1" for e in behind)


def test_pickle_and_json_forms_agree(fixtures: Path) -> None:
    for p, j in zip(_dumps(fixtures), _dumps(fixtures, ".json"), strict=True):
        assert [(e.pg_id, e.seq, e.op, e.retired) for e in p.entries] == [
            (e.pg_id, e.seq, e.op, e.retired) for e in j.entries
        ]


def _nccl_dump() -> dict:
    """An NCCL rank's dump as FlightRecorderDetail.hpp (version 2.10) lays it out."""
    base = {
        "pg_id": 0,
        "process_group": ["0", "default_pg"],
        "p2p_seq_id": 0,
        "is_p2p": False,
        "input_sizes": [[4096]],
        "input_dtypes": ["Float"],
        "output_sizes": [[4096]],
        "output_dtypes": ["Float"],
        "timeout_ms": 600000,
        "thread_id": "1",
        "thread_name": "pt_main_thread",
        "time_created_ns": 1,
        "frames": [],
    }
    entries = [
        {
            **base,
            "record_id": 0,
            "collective_seq_id": 41,
            "op_id": 41,
            "retired": True,
            "profiling_name": "nccl:all_reduce",
            "state": "completed",
            "duration_ms": 3.25,
            "time_discovered_started_ns": 2,
            "time_discovered_completed_ns": 3,
        },
        {
            **base,
            "record_id": 1,
            "collective_seq_id": 42,
            "op_id": 42,
            "retired": False,
            "profiling_name": "nccl:reduce_scatter",
            "state": "started",
            "time_discovered_started_ns": 4,
            "time_discovered_completed_ns": None,
        },
    ]
    return {
        "version": "2.10",
        "comm_lib_version": "2.21.5",
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
        "pg_status": {
            "0": {
                "last_enqueued_collective": 42,
                "last_started_collective": 42,
                "last_completed_collective": 41,
            }
        },
        "entries": entries,
    }


def test_nccl_states_and_membership_are_read() -> None:
    dump = _nccl_dump()
    rec0 = load_flight_record(json.dumps(dump).encode(), rank=0)
    assert [(e.seq, e.state, e.pending) for e in rec0.entries] == [
        (41, "completed", False),
        (42, "started", True),
    ]
    assert rec0.entries[0].duration_ms == 3.25
    assert rec0.pg_ranks == {"0": (0, 1)}
    # rank 1 is a member but recorded nothing: it is behind on the group
    rec1 = load_flight_record(
        json.dumps({"version": "2.10", "pg_config": dump["pg_config"]}).encode(), rank=1
    )
    events = flight_record_events([rec0, rec1], time=0.0).events
    behind = [e for e in events if e.kind == "nccl_rank_behind"]
    assert [(e.labels["rank"], e.value, e.labels["op"]) for e in behind] == [
        ("1", 1.0, "nccl:reduce_scatter")
    ]


def test_pickle_naming_code_is_refused_without_running_it(tmp_path: Path) -> None:
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self) -> tuple:
            return (Path.touch, (marker,))

    data = pickle.dumps({"version": "2.10", "entries": [Evil()]}, protocol=2)
    with pytest.raises(ParseError, match="refusing"):
        load_flight_record(data)
    assert not marker.exists()


def test_typed_lists_of_the_torchscript_pickler_are_allowed() -> None:
    data = (
        b"\x80\x02}X\x07\x00\x00\x00versionX\x04\x00\x00\x002.10sX\x01\x00\x00\x00x"
        b"ctorch.jit._pickle\nbuild_intlist\n]K\x01a\x85Rs."
    )
    assert load_flight_record(data).version == "2.10"


@pytest.mark.parametrize(
    "data", [b"", b"garbage", b"\x80\x02}q\x00", b'{"entries": []}', b"{not json", b"[1, 2]"]
)
def test_garbage_gives_a_clear_error(data: bytes) -> None:
    with pytest.raises(ParseError, match="dump|pickle|JSON"):
        load_flight_record(data)


def test_malformed_entries_are_counted() -> None:
    dump = _nccl_dump()
    dump["entries"] += ["junk", {"pg_id": "x"}, {"pg_id": 0, "collective_seq_id": None}]
    record = load_flight_record(json.dumps(dump).encode(), rank=0)
    assert len(record.entries) == 2
    assert flight_record_events([record], time=0).dropped == {"malformed_entry": 3}


def test_rank_from_filename() -> None:
    assert rank_from_filename("nccl_trace_rank_12") == 12
    assert rank_from_filename("nccl_trace_rank_3.json") == 3
    assert rank_from_filename("dump") is None


def test_watchdog_log_names_rank_group_and_sequence(fixtures: Path) -> None:
    text = (fixtures / "telemetry" / "nccl-watchdog.log").read_text()
    parsed = parse_watchdog_log(text, time=2.0)
    timeouts = [
        (e.labels["rank"], e.labels.get("pg_desc"), e.labels["op"], int(e.value))
        for e in parsed.events
        if e.kind == "nccl_timeout"
    ]
    assert timeouts == [
        ("0", None, "BROADCAST", 1),
        ("1", None, "BROADCAST", 1),
        ("3", "default_pg", "ALLGATHER", 64214),
    ]
    first = parsed.events[0]
    assert first.labels["timeout_ms"] == "600000"
    assert first.labels["ran_ms"] == "600081"
    failures = [
        (e.labels["rank"], e.labels.get("pg_id"), int(e.value), e.labels["last_completed"])
        for e in parsed.events
        if e.kind == "nccl_watchdog_failure"
    ]
    assert failures == [("1", "1", 1, "546"), ("3", None, 64214, "64213")]
    assert parsed.dropped == {"malformed_timeout": 1}


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_any_bytes_give_a_record_or_a_parse_error(data: bytes) -> None:
    try:
        record = load_flight_record(data)
    except ParseError:
        return
    flight_record_events([record], time=0.0)


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(st.sampled_from(["entries", "pg_config", "pg_status", "x"]), _json_values),
    st.lists(
        st.dictionaries(
            st.sampled_from(
                ["pg_id", "collective_seq_id", "state", "process_group", "retired", "is_p2p"]
            ),
            _json_values,
        ),
        max_size=5,
    ),
)
def test_wrong_types_inside_a_dump_never_crash(top: dict, entries: list) -> None:
    dump = {**top, "version": "2.10", "entries": entries}
    record = load_flight_record(json.dumps(dump).encode(), rank=0)
    other = load_flight_record(json.dumps({**top, "version": "2.10"}).encode(), rank=1)
    flight_record_events([record, other], time=0.0)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_any_log_text_parses_without_raising(text: str) -> None:
    parse_watchdog_log("Watchdog caught collective operation timeout: " + text, time=0.0)


def test_dump_folder_source_reports_a_hang_once_as_dumps_arrive(
    tmp_path: Path, fixtures: Path
) -> None:
    source = DumpFolderSource(tmp_path, clock=lambda: 4.0)
    assert source.collect() == []
    for rank in (0, 2):  # the ranks stuck in the collective dump first
        name = f"nccl_trace_rank_{rank}"
        (tmp_path / name).write_bytes((fixtures / "nccl" / name).read_bytes())
    first = source.collect()
    assert sorted((s.name, s.labels["rank"]) for s in first) == [
        ("nccl_pending_collective", "0"),
        ("nccl_pending_collective", "2"),
    ]
    assert source.collect() == []  # nothing changed
    (tmp_path / "nccl_trace_rank_1").write_bytes(
        (fixtures / "nccl" / "nccl_trace_rank_1").read_bytes()
    )
    (tmp_path / "unrelated.txt").write_text("x")
    second = source.collect()
    assert [(s.name, s.labels["rank"], s.value) for s in second] == [("nccl_rank_behind", "1", 5.0)]
    (tmp_path / "nccl_trace_rank_3").write_bytes(b"\x80\x02garbage")
    assert source.collect() == []
    assert source.dropped["unreadable_dump"] == 1


def test_watchdog_log_source_reports_each_timeout_once(tmp_path: Path, fixtures: Path) -> None:
    lines = (fixtures / "telemetry" / "nccl-watchdog.log").read_text().splitlines(keepends=True)
    log = tmp_path / "train.log"
    log.write_text("".join(lines[:6]))
    source = WatchdogLogSource(log, labels={"node": "n1"}, clock=lambda: 1.0)
    first = [(s.name, s.labels["rank"]) for s in source.collect()]
    assert first == [
        ("nccl_timeout", "0"),
        ("nccl_timeout", "1"),
        ("nccl_watchdog_failure", "1"),
        ("nccl_timeout", "3"),
    ]
    with log.open("a") as f:
        f.write("".join(lines[6:]))
    second = source.collect()
    # the repeat of rank 3's timeout (when its watchdog thread ends) is not reported again
    assert [(s.name, s.labels["rank"]) for s in second] == [("nccl_watchdog_failure", "3")]
    assert second[0].labels["node"] == "n1"
    assert source.dropped == {"malformed_timeout": 1}
