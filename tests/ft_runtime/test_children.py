"""Children armed with a parent-death signal do not outlive their parent, even when the
parent died before the child armed it (the kernel then never sends the signal)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil

from ft_runtime._children import die_with_parent

_PARENT_DIES_FIRST = """
import os, sys, time
from ft_runtime._children import die_with_parent
arm = die_with_parent()
parent = os.getpid()
child = os.fork()
if child == 0:
    while os.getppid() == parent:  # the parent is gone before the child arms
        time.sleep(0.01)
    arm()
    open(sys.argv[1], "w").write("outlived its parent")
    os._exit(0)
print(child, flush=True)
os._exit(0)
"""


def _gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def test_a_child_whose_parent_died_before_it_armed_ends_itself(tmp_path) -> None:
    mark = tmp_path / "outlived"
    out = subprocess.run(
        [sys.executable, "-c", _PARENT_DIES_FIRST, str(mark)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    child = int(out.stdout.split()[0])
    assert _gone(child, timeout_s=10), "the orphan is still running"
    assert not mark.exists(), mark.read_text()


def test_a_child_of_a_live_parent_runs_on() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(0.5)"],
        preexec_fn=die_with_parent(),
    )
    assert child.wait(timeout=10) == 0
