"""One run of the README's demo, shortened, shared by the tests that read it: the faulted
run and its fault-free reference (tests/eagleeye/test_demo.py, the reference's quiet in
test_quiet_healthy.py), with every rank process seen while it ran and its parent
(test_local_agents.py). Each test only reads what the run left."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.eagleeye.procs import is_rank, left_naming, naming, parent


@dataclass(frozen=True)
class DemoRun:
    """`eagleeye demo --steps 90 --kill-step 10` with its reference run, in ``root``."""

    root: Path
    pid: int
    returncode: int
    output: str  # stdout and stderr, whitespace collapsed
    parents: dict[int, int]  # every rank process seen while it ran -> its parent
    left: dict[int, str]  # processes naming ``root`` 20 s after the demo ended

    @property
    def faulted(self) -> Path:
        (run,) = [p for p in self.root.iterdir() if not p.name.endswith("-reference")]
        return run

    @property
    def reference(self) -> Path:
        (run,) = [p for p in self.root.iterdir() if p.name.endswith("-reference")]
        return run


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    root = tmp_path_factory.mktemp("demo")
    log = tmp_path_factory.mktemp("demo-output") / "output.txt"  # no pipe to fill
    with open(log, "w") as out:
        demo = subprocess.Popen(
            [
                sys.executable, "-m", "eagleeye", "demo",
                "--steps", "90", "--kill-step", "10", "--runs-dir", str(root),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={"COLUMNS": "160", **os.environ},
        )  # fmt: skip
    parents: dict[int, int] = {}
    try:
        while demo.poll() is None:
            for pid, cmdline in naming(root).items():
                if is_rank(cmdline) and pid not in parents:
                    parents[pid] = parent(pid)
            time.sleep(0.1)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    output = " ".join(log.read_text(errors="replace").split())
    return DemoRun(root, demo.pid, demo.returncode, output, parents, left_naming(root))
