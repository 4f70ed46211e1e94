"""The run store's writer: one SQLite file in WAL mode, written in batches by one thread.

Callers never wait on the disk: rows go into a queue and a background thread commits them
in one transaction every ``flush_interval_s`` (or sooner when many are waiting). WAL mode
lets other processes (the dashboard, tests) read while the run writes. Ids of findings are
handed out at once, so actions can point at the finding they answer before either is on
disk.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collector.types import Sample
from detectors.types import Finding
from eagleeye.errors import StoreError
from eagleeye.store.schema import migrate
from eagleeye.store.stacktext import with_host
from ft_runtime.types import LifecycleEvent, Outcome

log = logging.getLogger(__name__)
DB_NAME = "run.db"

_SQL_SAMPLE = "INSERT INTO samples VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
_SQL_COLLECTIVE = "INSERT INTO collectives VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
_SQL_FINDING = "INSERT INTO findings VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
_SQL_ACTION = (
    "INSERT INTO actions (time, finding_id, kind, target, reason, key, dry_run, "
    "status, detail, outcome_time) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_SQL_EVENT = "INSERT INTO events (time, subject, phase, attempt, detail) VALUES (?, ?, ?, ?, ?)"
_SQL_CHECKPOINT = (
    "INSERT INTO checkpoints (time, step, rank, attempt, state, tier, path, "
    "bytes, seconds) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_SQL_FAULT = "INSERT INTO faults (time, step, attempt, kind, rank, spec) VALUES (?, ?, ?, ?, ?, ?)"
_SQL_META = "INSERT OR REPLACE INTO meta VALUES (?, ?)"
_SQL_STACK = (
    "INSERT INTO stacks (time, finding_id, rank, attempt, pid, method, state, text) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
_SQL_MEMBERSHIP = (
    "INSERT INTO memberships (time, epoch, members, joining, expected, store_address) "
    "VALUES (?, ?, ?, ?, ?, ?)"
)


def connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA foreign_keys=ON")
    return conn


def _create_whole(path: Path) -> None:
    """Makes ``path`` a migrated, empty run store in one step, so that a reader never finds
    the file before its tables. The schema is written under a private name and linked into
    place; a store another process made first is kept as it is."""
    if path.exists():
        return
    draft = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    try:
        conn = connect(draft)
        try:
            migrate(conn)
        finally:
            conn.close()  # checkpoints the WAL into the file and removes it
        try:
            os.link(draft, path)
        except FileExistsError:
            pass
        except OSError:  # a file system without hard links: a rename, unless one came first
            if not path.exists():
                os.replace(draft, path)
    finally:
        draft.unlink(missing_ok=True)


class RunStore:
    """Writes one run's records. Thread-safe; ``close()`` flushes everything.

    Args:
        run_dir: the run's folder; the database is ``run_dir/run.db``.
        flush_interval_s: longest a row waits in memory before it is committed.
    """

    def __init__(
        self, run_dir: str | Path, flush_interval_s: float = 0.25, max_batch: int = 5000
    ) -> None:
        self.path = Path(run_dir) / DB_NAME
        try:
            _create_whole(self.path)
            self._conn = connect(self.path)
            migrate(self._conn)
            (last,) = self._conn.execute("SELECT coalesce(max(id), 0) FROM findings").fetchone()
        except (sqlite3.Error, OSError) as exc:
            raise StoreError(f"cannot open run store {self.path}: {exc}") from exc
        self._next_finding = int(last) + 1
        self._lock = threading.Lock()
        self._queue: queue.Queue[_Rows | tuple[str, Sequence[Any]] | threading.Event | None] = (
            queue.Queue()
        )
        self.flush_interval_s = flush_interval_s
        self.max_batch = max_batch
        self.error: Exception | None = None
        self.dropped = 0  # rows that could not be written (see _commit)
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="eagleeye-store", daemon=True)
        self._thread.start()

    # ---- records ------------------------------------------------------------------------
    def add_samples(self, samples: Iterable[Sample], attempt: int | None = None) -> None:
        rows: list[Sequence[Any]] = [
            (
                s.time,
                s.step,
                _int(s.labels.get("attempt"), attempt),
                _int(s.labels.get("rank")),
                _int(s.labels.get("replica")),
                s.labels.get("node"),
                s.name,
                s.value,
            )
            for s in samples
        ]
        if rows:  # one hand-over to the writer thread for all of them
            self._queue.put(_Rows(_SQL_SAMPLE, rows))

    def add_collective(self, sample: Sample) -> None:
        """A ``collective`` sample of the hook: value is its duration, time its exit."""
        labels = sample.labels
        self._put(
            _SQL_COLLECTIVE,
            (
                sample.step,
                _int(labels.get("attempt")),
                _int(labels.get("rank")),
                _int(labels.get("replica")),
                labels.get("node"),
                labels.get("op", "?"),
                labels.get("group", "world"),
                _int(labels.get("seq")),
                _int(labels.get("bytes")),
                sample.time - sample.value,
                sample.time,
            ),
        )

    def add_finding(self, finding: Finding) -> int:
        with self._lock:
            finding_id = self._next_finding
            self._next_finding += 1
        subject = finding.subject
        self._put(
            _SQL_FINDING,
            (
                finding_id,
                finding.time,
                finding.step,
                finding.kind,
                subject.scope,
                subject.rank,
                subject.replica,
                subject.node,
                finding.severity.value,
                finding.score,
                finding.detector,
                json.dumps(dict(finding.evidence)),
            ),
        )
        return finding_id

    def add_outcome(
        self, outcome: Outcome, finding_id: int | None, dry_run: bool, decided_at: float
    ) -> None:
        action = outcome.action
        self._put(
            _SQL_ACTION,
            (
                decided_at,
                finding_id,
                action.kind.value,
                action.target,
                action.reason,
                action.key,
                int(dry_run),
                outcome.status.value,
                outcome.detail,
                outcome.time,
            ),
        )

    def add_event(self, event: LifecycleEvent) -> None:
        self._put(
            _SQL_EVENT,
            (
                event.time,
                event.subject,
                event.phase.value,
                event.attempt,
                json.dumps(dict(event.detail), default=str),
            ),
        )

    def add_checkpoint(
        self,
        time: float,
        step: int,
        state: str,
        tier: str,
        *,
        rank: int | None = None,
        attempt: int | None = None,
        path: str | None = None,
        nbytes: int | None = None,
        seconds: float | None = None,
    ) -> None:
        self._put(_SQL_CHECKPOINT, (time, step, rank, attempt, state, tier, path, nbytes, seconds))

    def add_fault(
        self,
        time: float,
        step: int | None,
        attempt: int | None,
        kind: str,
        rank: int | None,
        spec: str,
    ) -> None:
        self._put(_SQL_FAULT, (time, step, attempt, kind, rank, spec))

    def add_membership(
        self,
        time: float,
        epoch: int,
        members: Sequence[int],
        joining: Sequence[int],
        expected: dict[int, int],
        store_address: str,
    ) -> None:
        """One decision of the quorum coordinator (``flush()`` to make it durable now)."""
        row = (
            time,
            epoch,
            json.dumps(list(members)),
            json.dumps(list(joining)),
            json.dumps({str(k): v for k, v in expected.items()}),
            store_address,
        )
        self._put(_SQL_MEMBERSHIP, row)

    def last_membership(self) -> dict[str, Any] | None:
        """The newest committed membership row, or None (flushes first)."""
        self.flush()
        conn = connect(self.path)
        try:
            row = conn.execute(
                "SELECT epoch, members, joining, expected, store_address FROM memberships "
                "ORDER BY id DESC LIMIT 1"
            ).fetchone()
        finally:
            conn.close()
        if row is None:
            return None
        epoch, members, joining, expected, address = row
        return {
            "epoch": int(epoch),
            "members": json.loads(members),
            "joining": json.loads(joining),
            "expected": {int(k): int(v) for k, v in json.loads(expected).items()},
            "store_address": address,
        }

    def add_stack(
        self,
        time: float,
        finding_id: int | None,
        rank: int,
        *,
        attempt: int | None,
        pid: int,
        method: str,
        state: str,
        text: str,
        host: str = "",
    ) -> None:
        """One rank's stacks, captured for a finding (a hang); ``host``: where they were
        read, across hosts (``stacktext``: stored as the text's first line)."""
        text = with_host(text, host)
        self._put(_SQL_STACK, (time, finding_id, rank, attempt, pid, method, state, text))

    def set_meta(self, key: str, value: Any) -> None:
        self._put(_SQL_META, (key, json.dumps(value, default=str)))

    # ---- flushing -----------------------------------------------------------------------
    def flush(self, timeout_s: float = 30.0) -> None:
        """Blocks until every row given so far is committed."""
        done = threading.Event()
        self._queue.put(done)
        if not done.wait(timeout_s):
            raise StoreError(f"run store {self.path} did not flush within {timeout_s} s")
        if self.error is not None:
            raise StoreError(f"run store {self.path} failed: {self.error}")

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()
        self._conn.close()

    def _put(self, sql: str, row: Sequence[Any]) -> None:
        self._queue.put((sql, row))

    def _run(self) -> None:
        """The writer thread: it never dies; a failure of its own is logged and the loop
        goes on with the rows it holds."""
        pending: dict[str, list[Sequence[Any]]] = {}
        waiters: list[threading.Event] = []
        while not self._closing:
            try:
                pending, waiters = self._round(pending, waiters)
            except Exception as exc:  # a bug here must not silently stop all recording
                self.error = exc
                log.exception("run store writer failed; it goes on")
                for waiter in waiters:
                    waiter.set()
                waiters = []

    def _round(
        self, pending: dict[str, list[Sequence[Any]]], waiters: list[threading.Event]
    ) -> tuple[dict[str, list[Sequence[Any]]], list[threading.Event]]:
        """Collects one batch from the queue and commits it."""
        try:
            item = self._queue.get(timeout=self.flush_interval_s)
        except queue.Empty:
            item = _TICK
        count = 0
        while True:
            if item is None:
                self._closing = True
            elif isinstance(item, threading.Event):
                waiters.append(item)
            elif isinstance(item, _Rows):
                pending.setdefault(item.sql, []).extend(item.rows)
                count += len(item.rows)
            elif item is not _TICK:
                pending.setdefault(item[0], []).append(item[1])
                count += 1
            if self._closing or count >= self.max_batch:
                break
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
        if self._commit(pending):
            pending = {}
        for waiter in waiters:
            waiter.set()
        return pending, []

    def _commit(self, pending: dict[str, list[Sequence[Any]]]) -> bool:
        """Commits in table order (findings before the actions that point at them).

        A row that cannot be written (a NaN where a value is required, an integer beyond
        64 bits, a dangling reference) fails the batch; the batch is then written row by
        row, such rows are dropped and counted (``dropped``, and an ``events`` row of
        subject ``store``), and the rest committed. On any other failure (the disk, a
        lock) the rows are kept for the next attempt, so nothing is lost.
        """
        if not pending:
            return True
        try:
            self._write(pending, isolate=False)
        except _ROW_ERRORS as exc:
            self._rollback()
            log.warning("run store batch has a row that cannot be written (%s); isolating", exc)
            try:
                self._write(pending, isolate=True)
            except sqlite3.Error as again:
                return self._failed(again)
        except sqlite3.Error as exc:
            return self._failed(exc)
        self.error = None
        return True

    def _write(self, pending: dict[str, list[Sequence[Any]]], isolate: bool) -> None:
        self._conn.execute("BEGIN")
        bad: list[str] = []
        for sql in sorted(pending, key=_ORDER.index):
            if not isolate:
                self._conn.executemany(sql, pending[sql])
                continue
            for row in pending[sql]:
                try:
                    self._conn.execute(sql, row)
                except _ROW_ERRORS as exc:
                    bad.append(f"{sql.split()[2]}: {type(exc).__name__}: {exc}"[:300])
        if bad:
            self.dropped += len(bad)
            log.error("run store dropped %d row(s) it cannot write; first: %s", len(bad), bad[0])
            detail = json.dumps({"dropped": len(bad), "total": self.dropped, "first": bad[0]})
            self._conn.execute(_SQL_EVENT, (time.time(), "store", "running", 0, detail))
        self._conn.execute("COMMIT")

    def _failed(self, exc: sqlite3.Error) -> bool:
        self.error = exc
        log.error("run store write failed, rows kept for a retry: %s", exc)
        self._rollback()
        return False

    def _rollback(self) -> None:
        try:
            self._conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass


_TICK: tuple[str, Sequence[Any]] = ("", ())


@dataclass(frozen=True, slots=True)
class _Rows:
    """Rows of one statement handed to the writer thread at once."""

    sql: str
    rows: list[Sequence[Any]]


# What one row can raise: a constraint it breaks, a value SQLite cannot bind (an integer
# beyond 64 bits, an unsupported type). OperationalError (disk, lock) is not one of them.
_ROW_ERRORS = (
    sqlite3.IntegrityError,
    sqlite3.InterfaceError,
    sqlite3.ProgrammingError,
    OverflowError,
    TypeError,
    ValueError,
)
_ORDER = [
    _SQL_META,
    _SQL_SAMPLE,
    _SQL_COLLECTIVE,
    _SQL_FINDING,
    _SQL_ACTION,
    _SQL_EVENT,
    _SQL_CHECKPOINT,
    _SQL_FAULT,
    _SQL_MEMBERSHIP,
    _SQL_STACK,
]


def _int(value: Any, default: int | None = None) -> int | None:
    if value is None or value == "":
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        return default
