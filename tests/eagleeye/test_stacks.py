"""Every rank's stacks on a hang: py-spy from outside, faulthandler as the fallback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from collector.types import Subject
from detectors.types import Finding, Severity
from eagleeye.stackdump import stack_file
from eagleeye.stacks import StackCapture, find_py_spy, top_frame
from eagleeye.store import RunReader, RunStore
from tests.eagleeye.procs import stop

REPO = Path(__file__).resolve().parents[2]
RANK = """
import os, time
from eagleeye.stackdump import enable_stack_dumps
assert enable_stack_dumps(os.environ, 3, 0)
def waiting_for_peers():
    print("ready", flush=True)
    while True:
        time.sleep(0.05)
waiting_for_peers()
"""


@pytest.fixture
def rank(tmp_path):
    env = {**os.environ, "EAGLEEYE_RUN_DIR": str(tmp_path)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    process = subprocess.Popen(
        [sys.executable, "-c", RANK], env=env, stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "ready"
    yield process
    os.kill(process.pid, signal.SIGCONT)
    process.kill()
    process.wait()


@pytest.mark.integration
@pytest.mark.skipif(find_py_spy() is None, reason="py-spy is not installed")
def test_py_spy_reads_a_stopped_rank_without_waking_it(tmp_path, rank) -> None:
    stop(rank.pid)
    (stack,) = StackCapture(tmp_path).capture({3: rank.pid})
    assert (stack.rank, stack.method, stack.state) == (3, "py-spy", "T")
    assert top_frame(stack.text).startswith("waiting_for_peers")


@pytest.mark.integration
def test_faulthandler_answers_when_py_spy_is_missing_but_a_stopped_rank_cannot(
    tmp_path, rank
) -> None:
    assert stack_file(tmp_path, 3).read_text().startswith(f"pid {rank.pid} ")
    (stack,) = StackCapture(tmp_path, py_spy="").capture({3: rank.pid})
    assert stack.method == "faulthandler"
    assert "in waiting_for_peers" in top_frame(stack.text)
    stop(rank.pid)
    (stopped,) = StackCapture(tmp_path, py_spy="").capture({3: rank.pid})
    assert (stopped.method, stopped.state) == ("none", "T")
    assert "stopped" in stopped.text
    # a process that never armed faulthandler is not signalled (it would die of it)
    (other,) = StackCapture(tmp_path, py_spy="").capture({4: os.getpid()})
    assert other.method == "none"


def test_stacks_are_stored_with_their_finding(tmp_path) -> None:
    store = RunStore(tmp_path)
    hang = Finding("hang", Subject(0, 1), 2.0, Severity.CRITICAL, 1.0, 5, {"stopped": 1.0})
    assert store.add_finding(hang) == 1
    store.add_stack(1.0, 1, 1, attempt=0, pid=42, method="py-spy", state="T", text="Thread 42")
    store.close()
    with RunReader(tmp_path) as reader:
        row = reader.stacks(finding_id=1).iloc[0]
    assert (row["rank"], row["method"], row["state"], row["text"]) == (
        1,
        "py-spy",
        "T",
        "Thread 42",
    )
