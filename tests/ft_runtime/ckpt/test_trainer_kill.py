"""SIGKILL a real trainer process during and after a save; its restart resumes bitwise."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.ft_runtime.ckpt._trainer import reference
from tests.ft_runtime.ckpt.conftest import RingFactory

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[3]


def run_trainer(ring: str, steps: int, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    cmd = [
        sys.executable,
        "-m",
        "tests.ft_runtime.ckpt._trainer",
        ring,
        "node0",
        str(steps),
        str(out),
        *extra,
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(
        cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )


def equal(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b, strict=True))  # type: ignore[arg-type]
    return bool(a == b)


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("when", "resumed"), [("during", 4), ("after", 5)])
def test_killed_trainer_resumes_from_newest_complete_snapshot_bitwise(
    holders: RingFactory, tmp_path: Path, when: str, resumed: int
) -> None:
    ring, _ = holders(1)
    spec = ",".join(f"{n}={ep}" for n, ep in ring.nodes)
    out = tmp_path / "final.pt"
    first = run_trainer(spec, 8, out, "--kill-at", "5", "--kill-when", when)
    assert first.returncode == -signal.SIGKILL, first.stderr
    assert "resumed 0 none" in first.stdout
    assert not out.exists()

    second = run_trainer(spec, 8, out)
    assert second.returncode == 0, second.stderr
    assert f"resumed {resumed} memory" in second.stdout
    final = torch.load(out, weights_only=True)
    assert equal(final, reference(8))  # as if the kill never happened, to the bit
