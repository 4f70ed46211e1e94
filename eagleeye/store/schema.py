"""The run store's schema and its migrations.

The schema version lives in SQLite's ``user_version``. Each migration moves the database
one version forward inside a transaction; a database newer than this code is refused
rather than guessed at.
"""

from __future__ import annotations

import sqlite3

from eagleeye.errors import StoreError

MIGRATIONS: tuple[str, ...] = (
    # version 1
    """
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    CREATE TABLE samples (
        time REAL NOT NULL, step INTEGER, attempt INTEGER,
        rank INTEGER, replica INTEGER, node TEXT,
        name TEXT NOT NULL, value REAL
    );
    CREATE INDEX samples_by_name ON samples (name, step);
    CREATE INDEX samples_by_rank ON samples (rank, step);
    CREATE TABLE collectives (
        step INTEGER, attempt INTEGER, rank INTEGER, replica INTEGER, node TEXT,
        op TEXT NOT NULL, process_group TEXT NOT NULL, seq INTEGER, bytes INTEGER,
        enter_time REAL NOT NULL, exit_time REAL NOT NULL
    );
    CREATE INDEX collectives_by_step ON collectives (step, rank);
    CREATE TABLE findings (
        id INTEGER PRIMARY KEY, time REAL NOT NULL, step INTEGER, kind TEXT NOT NULL,
        scope TEXT NOT NULL, rank INTEGER, replica INTEGER, node TEXT,
        severity TEXT NOT NULL, score REAL NOT NULL, detector TEXT, evidence TEXT NOT NULL
    );
    CREATE TABLE actions (
        id INTEGER PRIMARY KEY, time REAL NOT NULL,
        finding_id INTEGER REFERENCES findings (id),
        kind TEXT NOT NULL, target TEXT NOT NULL, reason TEXT NOT NULL, key TEXT NOT NULL,
        dry_run INTEGER NOT NULL, status TEXT NOT NULL, detail TEXT NOT NULL,
        outcome_time REAL NOT NULL
    );
    CREATE TABLE events (
        id INTEGER PRIMARY KEY, time REAL NOT NULL, subject TEXT NOT NULL,
        phase TEXT NOT NULL, attempt INTEGER NOT NULL, detail TEXT NOT NULL
    );
    CREATE TABLE checkpoints (
        id INTEGER PRIMARY KEY, time REAL NOT NULL, step INTEGER NOT NULL, rank INTEGER,
        attempt INTEGER, state TEXT NOT NULL, tier TEXT NOT NULL, path TEXT,
        bytes INTEGER, seconds REAL
    );
    CREATE TABLE faults (
        id INTEGER PRIMARY KEY, time REAL NOT NULL, step INTEGER, attempt INTEGER,
        kind TEXT NOT NULL, rank INTEGER, spec TEXT NOT NULL
    );
    """,
    # version 2: the quorum coordinator's memberships, one row per decision, newest last
    """
    CREATE TABLE memberships (
        id INTEGER PRIMARY KEY, time REAL NOT NULL, epoch INTEGER NOT NULL,
        members TEXT NOT NULL, joining TEXT NOT NULL, expected TEXT NOT NULL,
        store_address TEXT NOT NULL
    );
    CREATE INDEX memberships_by_epoch ON memberships (epoch);
    """,
    # version 3: every rank's stacks, captured when a hang is found
    """
    CREATE TABLE stacks (
        id INTEGER PRIMARY KEY, time REAL NOT NULL,
        finding_id INTEGER REFERENCES findings (id), rank INTEGER NOT NULL,
        attempt INTEGER, pid INTEGER, method TEXT NOT NULL, state TEXT NOT NULL,
        text TEXT NOT NULL
    );
    """,
    # version 4: per-metric reads (the ETTR's step times, per-step curves, heatmaps)
    # answered from the index alone, in step order
    """
    CREATE INDEX samples_cover ON samples (name, step, attempt, rank, time, value);
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)


def migrate(conn: sqlite3.Connection, migrations: tuple[str, ...] = MIGRATIONS) -> int:
    """Brings the database to the newest version; returns the version it had before."""
    (before,) = conn.execute("PRAGMA user_version").fetchone()
    if before > len(migrations):
        raise StoreError(
            f"run store has schema version {before}, newer than this Eagle Eye supports "
            f"({len(migrations)}); upgrade eagleeye to read it"
        )
    for version in range(before, len(migrations)):
        try:
            conn.execute("BEGIN")
            for statement in migrations[version].split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {version + 1}")
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            conn.execute("ROLLBACK")
            raise StoreError(f"migration to schema version {version + 1} failed: {exc}") from exc
    return int(before)
