"""The control commands under replica recovery, with real ranks: checkpoint, skip_batch and
rollback(step) each run at a step boundary every replica agreed on, and return an Outcome."""

from __future__ import annotations

import re
import time
from datetime import timedelta
from pathlib import Path

import pytest

from ft_runtime import _dist as dist
from ft_runtime.layout import JobLayout
from ft_runtime.quorum import QuorumService
from ft_runtime.replica import ReplicaSupervisor
from ft_runtime.replica.protocol import (
    SKIPPED,
    TRAINED,
    Heartbeat,
    LedgerMark,
    decode,
    key_heartbeat,
    key_ledger,
)
from ft_runtime.supervisor import LaunchSpec
from ft_runtime.types import Action, ActionKind, OutcomeStatus, Phase
from tests.eagleeye.replica_helpers import final_params_identical, finish, workload

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(240)]
STEPS = 120


def _step_of(store: dist.TCPStore, rank: int) -> int:
    key = key_heartbeat(rank)
    return decode(Heartbeat, store.get(key)).step if store.check([key]) else -1


def _mark(store: dist.TCPStore, replica: int, batch: int) -> str:
    return decode(LedgerMark, store.get(key_ledger(replica, batch))).outcome


def _wait_for_step(sup: ReplicaSupervisor, store: dist.TCPStore, step: int) -> None:
    deadline = time.monotonic() + 90
    while _step_of(store, 0) < step:
        assert time.monotonic() < deadline, "training did not get there"
        sup.poll()
        time.sleep(0.05)


def test_checkpoint_skip_batch_and_rollback_run_on_every_replica(tmp_path: Path) -> None:
    args = [*workload(STEPS, tmp_path / "params"), "--checkpoint-every", "0"]
    env = {"OMP_NUM_THREADS": "1", "EAGLEEYE_CHECKPOINT_DIR": str(tmp_path / "ckpt")}
    launch = LaunchSpec(
        ["-m", "eagleeye.workload.train", *args],
        JobLayout(3, 1, 3),
        "commands",
        str(tmp_path / "logs"),
        env=env,
    )
    sup = ReplicaSupervisor(launch, QuorumService(3, 1))
    sup.start()
    try:
        host, _, port = sup.quorum.address.rpartition(":")
        store = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=30))

        _wait_for_step(sup, store, 10)
        skip = finish(
            sup, sup.execute(Action(ActionKind.SKIP_BATCH, "replica:1", "loss spike", "s1"))
        )
        assert skip.status is OutcomeStatus.DONE, skip.detail
        skipped = re.fullmatch(r"skipped batches \{1: (\d+)\}", skip.detail)
        assert skipped is not None, skip.detail
        batch = int(skipped.group(1))
        assert _mark(store, 1, batch) == SKIPPED  # consumed, untrained
        assert _mark(store, 0, batch) == TRAINED  # the others trained theirs

        save = finish(
            sup, sup.execute(Action(ActionKind.CHECKPOINT, "job", "before a risky stretch", "c1"))
        )
        assert save.status is OutcomeStatus.DONE, save.detail
        saved = re.fullmatch(r"replica 0 saved step (\d+) to (.+)", save.detail)
        assert saved is not None, save.detail
        saved_step = int(saved.group(1))
        assert (Path(saved.group(2)) / "MANIFEST.json").is_file()

        _wait_for_step(sup, store, saved_step + 15)
        target = f"step:{saved_step + 5}"  # the newest checkpoint at or before it
        back = finish(sup, sup.execute(Action(ActionKind.ROLLBACK, target, "bad stretch", "r1")))
        assert back.status is OutcomeStatus.DONE, back.detail
        assert back.detail.endswith(f"rolled back to the checkpoint of step [{saved_step}]")
        # The answer comes before the next exchange's heartbeat: wait for that heartbeat.
        before, deadline = _step_of(store, 0), time.monotonic() + 10
        while (now := _step_of(store, 0)) == before and time.monotonic() < deadline:
            time.sleep(0.005)
        assert now <= saved_step + 3  # training resumed right after the checkpoint

        none = finish(sup, sup.execute(Action(ActionKind.ROLLBACK, "step:2", "too early", "r2")))
        assert none.status is OutcomeStatus.FAILED
        assert "no checkpoint at or before 2" in none.detail
        bad = finish(sup, sup.execute(Action(ActionKind.ROLLBACK, "rank:1", "wrong target", "r3")))
        assert bad.status is OutcomeStatus.FAILED

        deadline = time.monotonic() + 120
        while not sup.finished and time.monotonic() < deadline:
            sup.poll()
            sup.settle()
            time.sleep(0.05)
        assert sup.phase is Phase.SUCCEEDED
    finally:
        sup.stop_all()
    count, identical = final_params_identical(tmp_path / "params")
    assert (count, identical) == (3, True)
