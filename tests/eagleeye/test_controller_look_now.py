"""A stopped rank that the others wait for is judged without waiting out the tick: while the
loop waits for telemetry it asks the supervisor whether something is to be judged now, and
the tick that follows fences the replica with the stopped rank as evidence. Replicas are
fake (a fake launcher); the quorum store, the telemetry socket and the run store are real.
The tick here waits 60 s for telemetry that never comes: only the early look ends it.

A stop that comes before the steps' pace is known waits for a few step times (real
telemetry over the socket) before it names the step every rank saves at."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from collector.transport import TelemetryPublisher, TelemetryReceiver
from eagleeye.controller import Controller
from eagleeye.injector import OutsideInjector
from eagleeye.launch import _hold_is_no_hang
from eagleeye.stopping import pace_known, request_step, typical_step_s
from eagleeye.store import RunReader, RunStore
from ft_runtime.faults import parse_specs
from ft_runtime.layout import JobLayout
from ft_runtime.quorum import QuorumService
from ft_runtime.replica import ReplicaSupervisor
from ft_runtime.supervisor import LaunchSpec
from ft_runtime.testing import FakeLauncher
from remediation.policy import replica_restart_policy
from remediation.remediator import Remediator
from tests.conftest import VirtualClock
from tests.ft_runtime.test_replica_controller import beat

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def rig(tmp_path: Path, clock: VirtualClock):
    launch = LaunchSpec(["train.py"], JobLayout(2, 1, 2), "t", str(tmp_path / "logs"))
    launcher = FakeLauncher(clock)
    quorum = QuorumService(2, 1, clock=clock, stall_floor_s=0.1)
    sup = ReplicaSupervisor(launch, quorum, clock=clock, launcher=launcher)
    receiver, store = TelemetryReceiver(), RunStore(tmp_path)
    remediator = Remediator(replica_restart_policy(), sup, dry_run=True)
    controller = Controller(sup, receiver, store, [], remediator, tick_s=60.0)
    sup.start()
    for step in range(5):  # steady: both replicas enter each exchange, 0.1 s apart
        beat(sup, step, range(2))
        sup.poll()
        clock.advance(0.1)
    yield controller, sup, launcher
    sup.stop_all()
    receiver.close()
    store.close()


def test_a_stopped_rank_others_wait_for_ends_the_wait_and_is_fenced(rig, tmp_path) -> None:
    controller, sup, launcher = rig
    assert not sup.look_now()  # in step: nobody waits for anybody
    launcher.freeze(1)  # SIGSTOPped while it computes step 5
    beat(sup, 5, (0,))  # replica 0 enters the exchange and waits
    controller.tick()
    assert sup.quorum.current.members == (0,)
    controller.store.flush()
    with RunReader(tmp_path) as reader:
        findings = reader.findings()
    (hang,) = findings[findings["kind"] == "hang"].itertuples()
    assert (hang.rank, hang.detector) == (1, "quorum_stall")
    assert hang.evidence["stopped_rank_1"] == 1.0
    assert hang.score >= 1.0  # a stopped process is a hang outright, whatever the wait


def test_the_early_look_asks_once_and_not_for_a_running_or_held_rank(rig) -> None:
    _, sup, launcher = rig
    beat(sup, 5, (0,))
    assert not sup.look_now()  # rank 1 is late but runs: the tick's limit decides
    sup.held = lambda: {1}
    launcher.freeze(1)
    assert not sup.look_now()  # held stopped by a slow fault: slow, not stopped
    sup.held = lambda: ()
    assert sup.look_now()
    assert not sup.look_now()  # said once for this heartbeat: no busy loop on it
    assert sup.quorum.current.members == (0, 1)  # a look records and decides nothing


def test_a_rank_an_outside_slow_fault_holds_is_not_fenced_on_its_state(
    tmp_path: Path, clock: VirtualClock
) -> None:
    # A script without the in-loop hook is slowed from outside: the injector holds the rank
    # stopped (SIGSTOP, later SIGCONT). The run wires its holds into the supervisor, so the
    # stopped state of a held rank is no evidence; the limit judges it like any late rank.
    launch = LaunchSpec(["train.py"], JobLayout(2, 1, 2), "t", str(tmp_path / "logs"))
    launcher = FakeLauncher(clock)
    sup = ReplicaSupervisor(
        launch, QuorumService(2, 1, clock=clock, stall_floor_s=0.1), clock=clock, launcher=launcher
    )
    ranks_of = lambda: {pid: rank for rank, pid in sup.pids().items()}  # noqa: E731

    def send(pid: int, sig: int) -> None:
        (launcher.freeze if sig == signal.SIGSTOP else launcher.thaw)(ranks_of()[pid])

    injector = OutsideInjector(
        parse_specs(["slow:rank=1@time=0,seconds=30"]), sup.pids, lambda fired: None, send
    )
    receiver, store = TelemetryReceiver(), RunStore(tmp_path)
    remediator = Remediator(replica_restart_policy(), sup, dry_run=True)
    controller = Controller(sup, receiver, store, [], remediator, tick_s=0.01, injector=injector)
    _hold_is_no_hang(sup, controller)
    sup.start()
    try:
        for step in range(5):
            beat(sup, step, range(2))
            sup.poll()
            clock.advance(0.1)
        injector.new_attempt(0, 0.0)
        injector.poll(1.0)  # the hold begins: rank 1 stopped, held
        assert sup.held() == {1}
        beat(sup, 5, (0,))  # replica 0 waits for the held rank
        assert not sup.look_now()
        controller.tick()
        clock.advance(0.05)
        controller.tick()
        assert sup.quorum.current.members == (0, 1)
    finally:
        injector.close()
        sup.stop_all()
        receiver.close()
        store.close()


def test_a_stop_before_the_pace_is_known_waits_for_a_few_step_times(rig) -> None:
    controller, _, _ = rig
    rank = [TelemetryPublisher(controller.receiver.address) for _ in range(2)]
    try:
        for r, sender in enumerate(rank):  # the first step: warm-up, 30 times a steady one
            labels = {"rank": str(r), "replica": str(r), "node": f"node{r}", "attempt": "0"}
            sender.send(labels, [["step_time", 0.015, time.time(), 1]])
        while len(controller._last_step) < 2:  # the loop takes them as they come
            controller.tick()
        assert controller._last_step == {0: 1, 1: 1}
        assert not pace_known(controller._step_times)  # 105 steps of lead: far too few
        for step in range(2, 5):
            for r, sender in enumerate(rank):
                labels = {"rank": str(r), "replica": str(r), "node": f"node{r}", "attempt": "0"}
                sender.send(labels, [["step_time", 0.0005, time.time(), step]])
        controller._await_pace(controller.clock() + 1.0)  # the clock stands: till the pace
        assert pace_known(controller._step_times)
        newest = max(controller._last_step.values())
        assert request_step(newest, typical_step_s(controller._step_times)) == 3004
    finally:
        for sender in rank:
            sender.close()
