"""The flight-recorder parser stays within bounds on hostile dumps: huge integers and
shared references give its own error or a bounded record, never another exception."""

from __future__ import annotations

import json
import pickle

import pytest

from collector.errors import ParseError
from collector.nccl import MAX_ENTRIES, load_flight_record

ENTRY = {"pg_id": 0, "collective_seq_id": 1, "profiling_name": "nccl:all_reduce", "state": "x"}


def test_huge_integers_are_dropped_or_refused_not_raised() -> None:
    dump = {
        "version": "2.4",
        "entries": [
            {**ENTRY, "pg_id": 10**5000},
            {**ENTRY, "collective_seq_id": 10**30},
            {**ENTRY, "duration_ms": 10**400, "timeout_ms": 10**300},
            ENTRY,
        ],
        "pg_config": {"0": {"ranks": "[" + "9" * 5000 + ", 1]"}, "1": {"ranks": [10**50, 2]}},
        "pg_status": {"0": {"last_enqueued_collective": 10**40}},
    }
    record = load_flight_record(pickle.dumps(dump))
    assert record.dropped == 2
    assert [e.duration_ms for e in record.entries] == [None, None]
    assert record.pg_ranks["1"] == (2,)
    assert record.last_enqueued == {}
    with pytest.raises(ParseError):
        load_flight_record(b'{"version": 1, "entries": [' + b"9" * 5000 + b"]}")


def test_shared_references_cannot_amplify_a_dump() -> None:
    shared_list = list(range(1000))
    shared = {**ENTRY, "process_group": [shared_list, shared_list]}
    dump = {
        "version": shared_list,
        "entries": [shared] * 2_000_000,
        "pg_config": {str(i): {"ranks": [shared_list] * 100} for i in range(5000)},
    }
    data = pickle.dumps(dump)
    assert len(data) < 20_000_000
    record = load_flight_record(data)
    assert len(record.entries) == MAX_ENTRIES
    assert record.dropped == 2_000_000 - MAX_ENTRIES
    assert record.version == "?"
    assert {e.pg_name for e in record.entries} == {"?"}
    assert len(record.pg_ranks) <= 4096


def test_deep_json_is_the_parsers_error() -> None:
    with pytest.raises(ParseError):
        load_flight_record(b'{"version": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    assert load_flight_record(json.dumps({"version": 1}).encode()).entries == ()
