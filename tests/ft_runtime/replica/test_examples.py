"""The DDP example and its replica-recovery conversion stay a small diff apart."""

from __future__ import annotations

import difflib
from pathlib import Path

from eagleeye.launch import REPLICA_API

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def test_the_converted_ddp_script_changes_at_most_15_lines() -> None:
    plain = (EXAMPLES / "ddp_train.py").read_text().splitlines()
    converted = (EXAMPLES / "ddp_train_replica.py").read_text().splitlines()
    diff = list(difflib.unified_diff(plain, converted, lineterm="", n=0))
    added = [line for line in diff[2:] if line.startswith("+")]
    removed = [line for line in diff[2:] if line.startswith("-")]
    assert len(added) <= 15, added
    assert len(removed) <= 15, removed


def test_eagleeye_run_recognises_the_public_api_in_the_converted_script() -> None:
    converted = (EXAMPLES / "ddp_train_replica.py").read_text()
    plain = (EXAMPLES / "ddp_train.py").read_text()
    assert any(name in converted for name in REPLICA_API)
    assert not any(name in plain for name in REPLICA_API)
