from __future__ import annotations

import math
import multiprocessing
import sqlite3
import time

import pytest

from collector.types import Sample, Subject
from detectors.types import Finding, Severity
from eagleeye.errors import EagleEyeError, StoreError
from eagleeye.store import (
    SCHEMA_VERSION,
    RunReader,
    RunStore,
    create_run_dir,
    migrate,
    newest_run,
)
from eagleeye.store.writer import DB_NAME
from ft_runtime.types import Action, ActionKind, LifecycleEvent, Outcome, OutcomeStatus, Phase

LABELS = {"rank": "1", "replica": "0", "node": "node0", "attempt": "0"}


def test_records_round_trip_into_dataframes(tmp_path) -> None:
    store = RunStore(tmp_path)
    store.add_samples(
        [
            Sample("loss", 2.5, 10.0, LABELS, step=3),
            Sample("loss", math.nan, 10.5, {**LABELS, "rank": "0"}, step=3),
        ]
    )
    store.add_collective(
        Sample(
            "collective", 0.25, 11.0, {**LABELS, "op": "all_reduce", "seq": "7", "bytes": "1024"}, 3
        )
    )
    finding = Finding(
        "process_exit",
        Subject(replica=0, rank=1, node="node0"),
        1.0,
        Severity.CRITICAL,
        12.0,
        3,
        {"exit_code": -9},
        "process_exit",
    )
    finding_id = store.add_finding(finding)
    action = Action(ActionKind.RESTART, "job", "rank 1 died", "key")
    store.add_outcome(
        Outcome(action, OutcomeStatus.DONE, "restarted", 12.5),
        finding_id,
        dry_run=False,
        decided_at=12.1,
    )
    store.add_event(LifecycleEvent("rank:1", Phase.EXITED, 12.0, 0, {"exit_code": -9}))
    store.add_checkpoint(9.0, 2, "PERSISTENT", "disk", rank=1, nbytes=10)
    store.add_fault(11.9, 3, 0, "kill", 1, "kill:rank=1@step=3")
    store.set_meta("run_id", "r1")
    store.close()

    reader = RunReader(tmp_path)
    assert reader.meta() == {"run_id": "r1"}
    loss = reader.metric("loss")
    assert loss.loc[3, 1] == 2.5
    assert math.isnan(loss.loc[3, 0])
    coll = reader.collectives().iloc[0]
    assert coll["enter_time"] == 10.75
    assert coll["seq"] == 7
    assert coll["process_group"] == "world"
    assert reader.findings().iloc[0]["evidence"] == {"exit_code": -9}
    trail = reader.actions().iloc[0]
    assert trail["finding_kind"] == "process_exit"
    assert trail["status"] == "done"
    assert reader.events().iloc[0]["detail"] == {"exit_code": -9}
    assert reader.checkpoints().iloc[0]["state"] == "PERSISTENT"
    assert reader.faults().iloc[0]["spec"] == "kill:rank=1@step=3"


def test_an_action_may_be_written_before_its_finding_reaches_the_disk(tmp_path) -> None:
    # Findings are committed before actions whatever order rows were queued in.
    store = RunStore(tmp_path, flush_interval_s=60)
    action = Action(ActionKind.NOTIFY, "job", "r", "k")
    early = Finding("nan", Subject(rank=0), 1.0, Severity.WARN, 1.0, 1)
    first = store.add_finding(early)
    store.add_outcome(Outcome(action, OutcomeStatus.DONE, "", 2.0), first, False, 2.0)
    second = store.add_finding(early)
    store.add_outcome(Outcome(action, OutcomeStatus.DONE, "", 3.0), second, False, 3.0)
    store.flush()
    store.close()
    assert list(RunReader(tmp_path).actions()["finding_id"]) == [first, second]


def test_migrations_are_versioned_and_a_newer_store_is_refused(tmp_path) -> None:
    conn = sqlite3.connect(tmp_path / "a.db", isolation_level=None)
    assert migrate(conn) == 0
    assert migrate(conn) == SCHEMA_VERSION  # a second run changes nothing
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(StoreError, match="newer than this Eagle Eye supports"):
        migrate(conn)
    conn.close()


def test_a_failed_migration_rolls_back(tmp_path) -> None:
    conn = sqlite3.connect(tmp_path / "b.db", isolation_level=None)
    broken = ("CREATE TABLE t (x INTEGER); CREATE TABLE t (y INTEGER)",)
    with pytest.raises(StoreError, match="migration to schema version 1 failed"):
        migrate(conn, broken)
    assert conn.execute("PRAGMA user_version").fetchone() == (0,)
    assert conn.execute("SELECT name FROM sqlite_master").fetchall() == []


def _count_loss_rows(path: str, until: float, result: multiprocessing.Queue) -> None:
    reader = RunReader(path)
    seen = []
    while time.time() < until:
        seen.append(len(reader.samples(names=["loss"])))
        time.sleep(0.05)
    result.put(seen)


def test_another_process_reads_while_the_run_writes(tmp_path) -> None:
    store = RunStore(tmp_path, flush_interval_s=0.05)
    store.add_samples([Sample("loss", 1.0, 0.0, LABELS, step=0)])
    store.flush()
    ctx = multiprocessing.get_context("spawn")
    result = ctx.Queue()
    reader = ctx.Process(
        target=_count_loss_rows, args=(str(tmp_path / DB_NAME), time.time() + 4.0, result)
    )
    reader.start()
    for step in range(1, 60):
        store.add_samples([Sample("loss", 1.0, step, LABELS, step=step)])
        time.sleep(0.05)
    store.close()
    seen = result.get(timeout=30)
    reader.join(10)
    assert reader.exitcode == 0
    assert len(set(seen)) > 3, f"the reader saw no progress: {seen}"
    assert seen == sorted(seen)


def test_run_folders_are_validated(tmp_path) -> None:
    run = create_run_dir(tmp_path, "r1")
    assert (run / "logs").is_dir()
    assert (run / "checkpoints").is_dir()
    with pytest.raises(EagleEyeError, match="exists already"):
        create_run_dir(tmp_path, "r1")
    with pytest.raises(EagleEyeError, match="bad run id"):
        create_run_dir(tmp_path, "../escape")
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(EagleEyeError, match="cannot create run folder"):
        create_run_dir(blocker, "r2")
    RunStore(run).close()
    assert newest_run(tmp_path) == run
    with pytest.raises(EagleEyeError, match="no runs under"):
        newest_run(tmp_path / "empty")


def test_reading_a_missing_store_says_where_it_looked(tmp_path) -> None:
    with pytest.raises(StoreError, match="no run store at"):
        RunReader(tmp_path)


def test_a_version_3_store_is_migrated_to_the_covering_index(tmp_path) -> None:
    from eagleeye.store.schema import MIGRATIONS

    conn = sqlite3.connect(tmp_path / "run.db", isolation_level=None)
    migrate(conn, MIGRATIONS[:3])
    conn.execute("INSERT INTO samples VALUES (1.0, 0, 0, 0, 0, 'n0', 'step_time', 0.5)")
    conn.close()
    store = RunStore(tmp_path)  # opening it for writing migrates it
    store.close()
    with RunReader(tmp_path) as reader:
        plan = reader.query(
            "EXPLAIN QUERY PLAN SELECT rank, step, value FROM samples WHERE name = 'step_time'"
        )
        assert "COVERING INDEX samples_cover" in " ".join(plan["detail"])
        assert list(reader.metric("step_time").loc[0]) == [0.5]
    conn = sqlite3.connect(tmp_path / "run.db")
    assert conn.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
    conn.close()
