"""One bad row never costs the run its other records; a damaged store is one clear error."""

from __future__ import annotations

import math
import shutil
import sqlite3
import subprocess
import sys
import time

import pytest

from collector.types import Sample, Subject
from detectors.types import Finding, Severity
from eagleeye.errors import StoreError
from eagleeye.store import RunReader, RunStore
from eagleeye.store.writer import DB_NAME

LABELS = {"rank": "0", "replica": "0", "node": "node0", "attempt": "0"}


def finding(step: int) -> Finding:
    return Finding("hang", Subject(0, 0, "node0"), 1.0, Severity.CRITICAL, 5.0, step, {}, "x")


def test_rows_that_cannot_be_written_are_dropped_counted_and_the_rest_committed(tmp_path) -> None:
    store = RunStore(tmp_path, flush_interval_s=60)  # everything lands in one batch
    try:
        store.add_samples([Sample("loss", 1.0, 1.0, LABELS, step=1)])
        store.add_samples([Sample("loss", 1.0, math.nan, LABELS, step=2)])  # NaN time: NULL
        store.add_samples([Sample("loss", 1.0, 2.0, LABELS, step=2**64)])  # beyond 64 bits
        store.add_checkpoint(3.0, 10**30, "PERSISTENT", "disk")
        store.add_fault(math.nan, 1, 0, "kill", 0, "kill:rank=0@step=1")
        first = store.add_finding(finding(3))
        store.add_samples([Sample("loss", 1.0, 4.0, LABELS, step=4)])
        store.flush()
        assert store.dropped == 4
        # The writer is alive and commits what comes later.
        store.add_samples([Sample("loss", 1.0, 5.0, LABELS, step=5)])
        store.add_finding(finding(6))
        store.flush()
    finally:
        store.close()
    with RunReader(tmp_path) as reader:
        assert list(reader.samples()["step"]) == [1, 4, 5]
        assert list(reader.findings()["id"]) == [first, first + 1]
        assert reader.checkpoints().empty
        assert reader.faults().empty
        (detail,) = reader.events().query("subject == 'store'")["detail"]
    assert detail["dropped"] == 4
    assert "samples" in detail["first"]


def test_the_writer_survives_a_value_sqlite_cannot_bind(tmp_path) -> None:
    store = RunStore(tmp_path)
    try:
        store.add_stack(1.0, None, 0, attempt=0, pid=1, method="x", state="S", text=object())  # type: ignore[arg-type]
        store.add_samples([Sample("loss", 1.0, 2.0, LABELS, step=1)])
        store.flush()
        assert store.dropped == 1
    finally:
        store.close()
    with RunReader(tmp_path) as reader:
        assert list(reader.samples()["step"]) == [1]


def test_a_store_whose_disk_fails_keeps_its_rows_for_a_retry(tmp_path) -> None:
    store = RunStore(tmp_path)
    try:
        store.add_samples([Sample("loss", 1.0, 1.0, LABELS, step=1)])
        store.flush()
        conn = sqlite3.connect(tmp_path / DB_NAME, isolation_level=None, timeout=0.1)
        conn.execute("BEGIN EXCLUSIVE")
        store._conn.execute("PRAGMA busy_timeout = 50")
        store.add_samples([Sample("loss", 1.0, 2.0, LABELS, step=2)])
        with pytest.raises(StoreError, match="failed"):
            store.flush()
        conn.execute("ROLLBACK")
        conn.close()
        store.flush()
        assert store.dropped == 0
    finally:
        store.close()
    with RunReader(tmp_path) as reader:
        assert list(reader.samples()["step"]) == [1, 2]


def damaged_copy(tmp_path, source):
    run = tmp_path / "damaged"
    run.mkdir()
    data = bytearray((source / DB_NAME).read_bytes())
    middle = len(data) // 2
    data[middle : middle + 8192] = b"\xa5" * 8192
    (run / DB_NAME).write_bytes(bytes(data))
    return run


@pytest.fixture
def full_run(tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    store = RunStore(source)
    store.set_meta("run_id", "x")
    store.add_samples(Sample("loss", float(i), float(i), LABELS, step=i) for i in range(20_000))
    store.add_finding(finding(1))
    store.close()
    return source


def test_a_store_being_created_is_absent_to_readers_until_its_tables_exist(
    tmp_path, monkeypatch
) -> None:
    """A reader that looks while a run's store is being made (a dashboard, an agent's peer)
    finds no store yet, never an empty file it must call damaged."""
    import eagleeye.store.writer as writer

    seen: list[str] = []

    def migrate_and_look(conn: sqlite3.Connection) -> int:
        try:
            RunReader(tmp_path).close()
            seen.append("opened")
        except StoreError as exc:
            seen.append(str(exc))
        return real_migrate(conn)

    real_migrate = writer.migrate
    monkeypatch.setattr(writer, "migrate", migrate_and_look)
    RunStore(tmp_path).close()
    assert seen[0].startswith("no run store at"), seen
    assert sorted(p.name for p in tmp_path.iterdir()) == [DB_NAME]  # no draft left behind
    with RunReader(tmp_path) as reader:
        assert reader.events().empty
    RunStore(tmp_path).close()  # an existing store is opened, not made again


def test_an_empty_store_file_is_one_clear_error(tmp_path) -> None:
    (tmp_path / DB_NAME).write_bytes(b"")
    with pytest.raises(StoreError, match="not a run store"):
        RunReader(tmp_path)
    (tmp_path / DB_NAME).write_bytes(b"garbage" * 1000)
    with pytest.raises(StoreError, match="damaged or not a run store"):
        RunReader(tmp_path)


def test_a_damaged_store_is_a_store_error_in_every_reader(tmp_path, full_run) -> None:
    run = damaged_copy(tmp_path, full_run)
    with RunReader(run) as reader:
        with pytest.raises(StoreError, match="damaged"):
            reader.check()
        failed = []
        for read in (reader.meta, reader.samples, reader.findings, reader.events):
            try:
                read()
            except StoreError:  # the damaged page is one it reads: a clear error, no other
                failed.append(read.__name__)
    assert "samples" in failed


def test_a_damaged_meta_value_is_a_store_error(tmp_path) -> None:
    store = RunStore(tmp_path)
    store.close()
    conn = sqlite3.connect(tmp_path / DB_NAME)
    conn.execute("INSERT INTO meta VALUES ('run_id', '{not json')")
    conn.commit()
    conn.close()
    with RunReader(tmp_path) as reader, pytest.raises(StoreError, match="damaged meta"):
        reader.meta()


@pytest.mark.parametrize("content", [b"", b"\x00" * 4096])
def test_the_dashboard_refuses_an_unreadable_store_at_start(tmp_path, content) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / DB_NAME).write_bytes(content)
    result = subprocess.run(
        [sys.executable, "-m", "eagleeye", "dashboard", "--run", str(run)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert "run store" in result.stderr


def test_the_dashboard_refuses_a_damaged_store_at_start(tmp_path, full_run) -> None:
    run = damaged_copy(tmp_path, full_run)
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "eagleeye", "dashboard", "--run", str(run)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0, time.monotonic() - started
    assert "Traceback" not in result.stderr
    assert "damaged" in result.stderr
    shutil.rmtree(run)
