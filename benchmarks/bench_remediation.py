"""Cost of one ``Remediator.handle`` under the default policy file (ladders, cooldowns,
rate limits, incidents) against the built-in one-rule synchronous-restart policy, both on
the same stream of findings, interleaved in one process.

Run from the repository root: ``python benchmarks/bench_remediation.py``.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from collector.types import Subject
from detectors.types import Finding, Severity
from ft_runtime.testing import FakeRuntime
from remediation import Hooks, Remediator, load_policy, synchronous_restart_policy

POLICY = Path(__file__).resolve().parents[1] / "remediation" / "policies" / "default.toml"
KINDS = ("slow_rank", "nan", "process_exit", "loss_spike", "xid", "slow_node")


def findings(n: int) -> list[Finding]:
    """A mixed stream over 64 ranks on 8 nodes, one step per finding."""
    out = []
    for i in range(n):
        rank = (i * 7) % 64
        subject = Subject(replica=rank // 16, rank=rank, node=f"n{rank // 8}")
        severity = Severity.CRITICAL if i % 5 == 0 else Severity.WARN
        out.append(Finding(KINDS[i % len(KINDS)], subject, 2.0, severity, 1000.0 + i, i))
    return out


def per_finding_us(remediator: Remediator, stream: list[Finding]) -> float:
    start = time.perf_counter()
    for finding in stream:
        remediator.handle(finding)
    return (time.perf_counter() - start) / len(stream) * 1e6


def main(rounds: int = 20, n: int = 5000) -> None:
    stream = findings(n)
    ours, base = [], []
    for _ in range(rounds):
        hooks = Hooks()
        base.append(
            per_finding_us(
                Remediator(synchronous_restart_policy(), FakeRuntime(), False, hooks=hooks), stream
            )
        )
        ours.append(
            per_finding_us(
                Remediator(load_policy(POLICY), FakeRuntime(), False, hooks=hooks), stream
            )
        )
    b, o = statistics.median(base), statistics.median(ours)
    print(
        f"built-in policy: {b:.2f} µs/finding; default.toml: {o:.2f} µs/finding; "
        f"ratio {o / b:.2f} ({n} findings x {rounds} rounds)"
    )


if __name__ == "__main__":
    main()
