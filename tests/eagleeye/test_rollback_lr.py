"""A policy's ``lr_factor`` reaches the ranks: after a rollback with ``lr_factor = 0.5`` they
train the replayed steps at half the learning rate they had the first time."""

from __future__ import annotations

import re
import time
from collections import defaultdict
from datetime import timedelta
from pathlib import Path

import pytest

from collector.transport import TelemetryReceiver
from ft_runtime import _dist as dist
from ft_runtime.layout import JobLayout
from ft_runtime.quorum import QuorumService
from ft_runtime.replica import ReplicaSupervisor
from ft_runtime.supervisor import LaunchSpec
from ft_runtime.types import Action, ActionKind, OutcomeStatus
from remediation.config import parse_policy
from tests.eagleeye.replica_helpers import finish, workload

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(240)]
POLICY = """
[[rule]]
kind = "loss_spike"
ladder = [{ do = ["rollback:job"], params = { lr_factor = 0.5 } }]
"""


def test_a_rollback_with_lr_factor_halves_the_learning_rate(tmp_path: Path) -> None:
    (params,) = parse_policy(POLICY).rules[0].ladder[0].steps[0].params.items()
    receiver = TelemetryReceiver()
    env = {
        "OMP_NUM_THREADS": "1",
        "EAGLEEYE_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
        "EAGLEEYE_TELEMETRY": receiver.address,
    }
    args = [*workload(60, tmp_path / "params"), "--checkpoint-every", "0", "--warmup", "1000"]
    launch = LaunchSpec(
        ["-m", "eagleeye.workload.train", *args], JobLayout(2, 1, 2), "lr", str(tmp_path), env=env
    )
    sup = ReplicaSupervisor(launch, QuorumService(2, 1))
    lrs: dict[int, list[float]] = defaultdict(list)

    def drain_until(step: int) -> None:
        deadline = time.monotonic() + 90
        while max(lrs, default=-1) < step:
            assert time.monotonic() < deadline, "training did not get there"
            sup.poll()
            for s in receiver.receive(timeout_s=0.05):
                if s.name == "lr" and s.labels.get("rank") == "0" and s.step is not None:
                    lrs[s.step].append(s.value)

    sup.start()
    try:
        host, _, port = sup.quorum.address.rpartition(":")
        dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=30))
        drain_until(8)
        save = finish(sup, sup.execute(Action(ActionKind.CHECKPOINT, "job", "before", "c1")))
        assert save.status is OutcomeStatus.DONE, save.detail
        saved = int(re.search(r"saved step (\d+)", save.detail).group(1))  # type: ignore[union-attr]
        drain_until(saved + 6)
        back = finish(
            sup, sup.execute(Action(ActionKind.ROLLBACK, "job", "spike", "r1", (params,)))
        )
        assert back.status is OutcomeStatus.DONE, back.detail
        assert back.detail.endswith("learning rate x0.5")
        deadline = time.monotonic() + 60
        while len(lrs[saved + 2]) < 2:
            assert time.monotonic() < deadline, "no replayed step"
            drain_until(max(lrs) + 1)
    finally:
        sup.stop_all()
        receiver.close()
    first, replayed = lrs[saved + 2][:2]
    assert replayed == pytest.approx(first * 0.5)
