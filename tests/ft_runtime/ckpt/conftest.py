from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ft_runtime.ckpt import HolderConfig, HolderProcess, Ring
from ft_runtime.ports import free_port


def make_ring(n: int) -> Ring:
    return Ring(tuple((f"node{i}", f"tcp://127.0.0.1:{free_port()}") for i in range(n)))


RingFactory = Callable[..., tuple[Ring, list[HolderProcess]]]


@pytest.fixture
def job() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture
def holders(job: str, tmp_path: Path) -> Iterator[RingFactory]:
    """Starts ``n`` holder processes (one per virtual node) and stops them afterwards."""
    started: list[HolderProcess] = []

    def start(n: int = 1, **kw: object) -> tuple[Ring, list[HolderProcess]]:
        ring = make_ring(n)
        procs = [
            HolderProcess(HolderConfig(job, node, ring, **kw))  # type: ignore[arg-type]
            for node, _ in ring.nodes
        ]
        for p in procs:  # in parallel: each holder spends seconds importing torch
            started.append(p.launch())
        for p in procs:
            p.wait_ready()
        return ring, procs

    yield start
    for p in started:
        if p.proc is not None and p.proc.poll() is None:
            p.proc.terminate()
    for p in started:
        p.wait()
    for seg in Path("/dev/shm").glob(f"eeckpt.{job}.*"):
        seg.unlink()


def wait_for(pred: Callable[[], object], timeout: float = 20.0, what: str = "condition") -> None:
    """Polls ``pred`` until it is truthy; fails the test naming ``what`` otherwise."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")
