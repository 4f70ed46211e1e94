"""The quorum coordinator restarts from the run store while real ranks train on.

The coordinator is dropped with its run-store writer (as when its process dies), and a new
one is started on a freshly opened store of the same run: it finds the store the ranks talk
to, resumes at the newest epoch and numbers the next membership change from there.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from eagleeye.store import RunReader, RunStore, StoreMembershipLog
from ft_runtime.layout import JobLayout
from ft_runtime.quorum import QuorumService
from ft_runtime.replica import ReplicaSupervisor
from ft_runtime.replica.auth import JobSecret
from ft_runtime.replica.protocol import Heartbeat, decode, key_heartbeat
from ft_runtime.replica.store import SealedStore, connect
from ft_runtime.supervisor import LaunchSpec
from ft_runtime.types import Action, ActionKind, OutcomeStatus, Phase
from tests.eagleeye.replica_helpers import final_params_identical, workload

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(240)]
STEPS = 160


def _step_of(store: SealedStore, rank: int) -> int:
    key = key_heartbeat(rank)
    return decode(Heartbeat, store.get(key)).step if store.check([key]) else -1


def _drive(sup: ReplicaSupervisor, until, timeout_s: float = 90.0) -> list:
    """Polls the supervisor like the controller does; restarts a replica that exited."""
    events: list = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        new = sup.poll() + sup.settle()
        events += new
        for event in new:
            replica = event.subject.removeprefix("replica:")
            if event.subject.startswith("replica:") and event.phase is Phase.EXITED:
                key = f"restart/{replica}/{event.time}"
                outcome = sup.execute(Action(ActionKind.RESTART, event.subject, "exited", key))
                assert outcome.status is OutcomeStatus.DONE, outcome.detail
        if until(events):
            return events
        time.sleep(0.05)
    raise AssertionError(f"timed out; events so far: {events}")


def _admitted(replica: int):
    def done(events: list) -> bool:
        return any(e.subject == f"replica:{replica}" and "joined_epoch" in e.detail for e in events)

    return done


def test_a_coordinator_restarted_from_the_run_store_keeps_the_epochs_and_training(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    store = RunStore(run_dir)
    layout = JobLayout(3, 1, 3)
    command = ["-m", "eagleeye.workload.train", *workload(STEPS, tmp_path / "params")]
    env = {"OMP_NUM_THREADS": "1", "EAGLEEYE_CHECKPOINT_DIR": str(tmp_path / "ckpt")}
    launch = LaunchSpec(command, layout, "coordinator", str(tmp_path / "logs"), env=env)
    sup = ReplicaSupervisor(launch, QuorumService(3, 1, log=StoreMembershipLog(store)))
    sup.start()
    try:
        assert sup.store_host is not None
        assert sup.store_host.alive
        address = sup.quorum.address
        ranks = connect(address, JobSecret(sup.quorum.secret))

        _drive(sup, lambda _: _step_of(ranks, 0) >= 15)
        os.kill(sup.pids()[2], signal.SIGKILL)
        _drive(sup, _admitted(2))
        before = sup.quorum.current.epoch
        assert before == 2  # 0: everyone; 1: replica 2 dropped; 2: replica 2 admitted

        # The coordinator dies with its writer; the ranks train on without it.
        sup.quorum.close()
        store.close()
        outage_from = {rank: _step_of(ranks, rank) for rank in (0, 1, 2)}
        deadline = time.monotonic() + 30
        while not all(_step_of(ranks, rank) > outage_from[rank] for rank in (0, 1, 2)):
            assert time.monotonic() < deadline, "a rank stopped training without the coordinator"
            time.sleep(0.1)

        store = RunStore(run_dir)
        sup.restart_coordinator("coordinator killed", log=StoreMembershipLog(store))
        assert sup.quorum.resumed
        assert sup.quorum.current.epoch == before
        assert sup.quorum.address == address  # found in the run store

        # The next change is numbered after the last one before the restart.
        os.kill(sup.pids()[1], signal.SIGKILL)
        _drive(sup, _admitted(1))
        assert sup.quorum.current.epoch == before + 2
        events = _drive(sup, lambda _: sup.finished, timeout_s=120.0)
        assert sup.phase is Phase.SUCCEEDED, events
    finally:
        sup.stop_all()
        store.close()

    assert sup.store_host is not None
    assert not sup.store_host.alive
    with RunReader(run_dir) as reader:
        epochs = list(reader.memberships()["epoch"])
    # Every decision recorded, in order, one epoch sequence across the restart.
    assert sorted(set(epochs)) == list(range(before + 3))
    assert epochs == sorted(epochs)
    count, identical = final_params_identical(tmp_path / "params")
    assert (count, identical) == (3, True)
