"""The embedded run store: one SQLite file per run, written in batches, read as DataFrames."""

from __future__ import annotations

from eagleeye.store.memberships import StoreMembershipLog
from eagleeye.store.reader import RunReader
from eagleeye.store.runs import create_run_dir, new_run_id, newest_run
from eagleeye.store.schema import SCHEMA_VERSION, migrate
from eagleeye.store.writer import DB_NAME, RunStore

__all__ = [
    "DB_NAME",
    "SCHEMA_VERSION",
    "RunReader",
    "RunStore",
    "StoreMembershipLog",
    "create_run_dir",
    "migrate",
    "new_run_id",
    "newest_run",
]
