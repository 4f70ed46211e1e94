"""Reads a run store into pandas DataFrames, safely while the run is still writing.

This is the API the dashboard, the demo summary and the tests use.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from eagleeye.errors import StoreError
from eagleeye.store.schema import SCHEMA_VERSION
from eagleeye.store.stacktext import split_host
from eagleeye.store.writer import DB_NAME

_TABLES = "SELECT name FROM sqlite_master WHERE type = 'table'"


class RunReader:
    """Read-only view of one run. Each call runs a fresh query, so it sees new rows.

    Args:
        run: the run's folder or its ``run.db`` file.
    """

    def __init__(self, run: str | Path) -> None:
        path = Path(run)
        self.path = path / DB_NAME if path.is_dir() else path
        if not self.path.exists():
            raise StoreError(f"no run store at {self.path}; pass a run folder under runs/")
        try:
            self._conn = sqlite3.connect(
                f"file:{self.path}?mode=ro", uri=True, timeout=30, check_same_thread=False
            )
            (version,) = self._conn.execute("PRAGMA user_version").fetchone()
            tables = {row[0] for row in self._conn.execute(_TABLES)}
        except sqlite3.Error as exc:
            self._conn.close()
            raise StoreError(
                f"cannot read run store {self.path}: {exc}; the file is damaged or not a run store"
            ) from exc
        if version == 0 or "meta" not in tables:
            self._conn.close()
            raise StoreError(
                f"{self.path} is not a run store (empty or not written by Eagle Eye); "
                "pass the folder of a run that started"
            )
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"run store {self.path} has schema version {version}; this "
                f"Eagle Eye reads up to {SCHEMA_VERSION}; upgrade eagleeye"
            )

    def close(self) -> None:
        self._conn.close()

    def check(self) -> None:
        """Reads every page of the file; raises StoreError if any is damaged."""
        try:
            problems = [row[0] for row in self._conn.execute("PRAGMA quick_check(5)")]
        except sqlite3.Error as exc:
            problems = [str(exc)]
        if problems != ["ok"]:
            raise StoreError(
                f"run store {self.path} is damaged ({'; '.join(problems)[:300]}); "
                "restore it from a copy or read another run"
            )

    def __enter__(self) -> RunReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def query(self, sql: str, params: Sequence[Any] = ()) -> pd.DataFrame:
        try:
            return pd.read_sql_query(sql, self._conn, params=list(params))
        except (sqlite3.Error, pd.errors.DatabaseError) as exc:
            raise StoreError(f"query on {self.path} failed: {exc}") from exc

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """The rows of a query as tuples (no DataFrame: for bulk numeric reads)."""
        try:
            return self._conn.execute(sql, list(params)).fetchall()
        except sqlite3.Error as exc:
            raise StoreError(f"query on {self.path} failed: {exc}") from exc

    def meta(self) -> dict[str, Any]:
        try:
            rows = self._conn.execute("SELECT key, value FROM meta").fetchall()
        except sqlite3.Error as exc:
            raise StoreError(f"reading the meta of {self.path} failed: {exc}") from exc
        return {key: self._json(value, "meta") for key, value in rows}

    def _json(self, text: Any, column: str) -> Any:
        try:
            return json.loads(text)
        except (TypeError, ValueError, RecursionError) as exc:
            raise StoreError(
                f"run store {self.path} holds a damaged {column} value: {exc}"
            ) from None

    def _parse(self, frame: pd.DataFrame, column: str) -> None:
        frame[column] = frame[column].map(lambda text: self._json(text, column))

    def samples(
        self, names: Sequence[str] | None = None, ranks: Sequence[int] | None = None
    ) -> pd.DataFrame:
        """Long table: time, step, attempt, rank, replica, node, name, value."""
        where: list[str] = []
        params: list[Any] = []
        for column, wanted in (("name", names), ("rank", ranks)):
            if wanted:
                where.append(f"{column} IN ({', '.join('?' * len(wanted))})")
                params.extend(wanted)
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        return self.query(f"SELECT * FROM samples{clause} ORDER BY time", params)

    def metric(self, name: str) -> pd.DataFrame:
        """One metric as a step × rank table (the newest attempt's value wins)."""
        frame = self.query(
            "SELECT step, rank, value FROM samples WHERE name = ? ORDER BY attempt, time", [name]
        )
        if frame.empty:
            return frame
        # SQLite stores NaN as NULL; it reads back as NaN and must not be dropped here.
        latest = frame.drop_duplicates(["step", "rank"], keep="last")
        return latest.pivot(index="step", columns="rank", values="value")

    def collectives(self) -> pd.DataFrame:
        return self.query("SELECT * FROM collectives ORDER BY enter_time")

    def findings(self) -> pd.DataFrame:
        frame = self.query("SELECT * FROM findings ORDER BY time")
        self._parse(frame, "evidence")
        return frame

    def actions(self) -> pd.DataFrame:
        """The audit trail: each action with the finding it answered."""
        return self.query(
            "SELECT a.*, f.kind AS finding_kind, f.scope AS finding_scope, "
            "f.rank AS finding_rank, f.time AS finding_time "
            "FROM actions a LEFT JOIN findings f ON a.finding_id = f.id ORDER BY a.time, a.id"
        )

    def events(self) -> pd.DataFrame:
        frame = self.query("SELECT * FROM events ORDER BY time, id")
        self._parse(frame, "detail")
        return frame

    def checkpoints(self) -> pd.DataFrame:
        return self.query("SELECT * FROM checkpoints ORDER BY time")

    def faults(self) -> pd.DataFrame:
        return self.query("SELECT * FROM faults ORDER BY time")

    def stacks(self, finding_id: int | None = None) -> pd.DataFrame:
        """Ranks' stacks captured on hangs: time, finding_id, rank, attempt, pid, method
        (py-spy, faulthandler or none), state (of the process: T stopped, ...), text, and
        host (where they were read, across hosts; "" for ``eagleeye run``'s)."""
        if finding_id is None:
            frame = self.query("SELECT * FROM stacks ORDER BY id")
        else:
            frame = self.query(
                "SELECT * FROM stacks WHERE finding_id = ? ORDER BY id", [finding_id]
            )
        split = [split_host(str(text)) for text in frame["text"]]
        frame["host"] = [host for host, _ in split]
        frame["text"] = [text for _, text in split]
        return frame

    def memberships(self) -> pd.DataFrame:
        """The quorum coordinator's decisions: time, epoch, members, joining, expected."""
        frame = self.query("SELECT * FROM memberships ORDER BY id")
        for column in ("members", "joining", "expected"):
            self._parse(frame, column)
        return frame
