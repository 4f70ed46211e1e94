"""A controller restarted from its run store, in parts (real sockets, a real store): an
agent whose controller went away is asked for a hello again by the new one and declares
what it runs, as the same agent process (its session); the restored agents get a fresh
heartbeat window on the new controller's clock, so none is lost right after the
restart; the journal refuses a run that ended or a changed job, and a run that never
launched starts over. A restored coordinator sends an agent still on an earlier attempt
the current launch, and answers an agent of the same name but a new process (another
session) as a lost host."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import zmq

from eagleeye.agents import AgentLink, AgentState, Membership
from eagleeye.agents import resume as journal
from eagleeye.agents.coordinator import JobCoordinator
from eagleeye.errors import EagleEyeError
from eagleeye.store import RunReader, RunStore
from ft_runtime.layout import JobLayout
from ft_runtime.ports import free_port

SECRET = b"0123456789abcdef0123456789abcdef"
CONFIG = {"nnodes": 2, "nproc_per_node": 1, "recovery": "job", "snapshots": False}


def wait_for(check, limit: float = 10.0):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.02)
    raise AssertionError("not seen in time")


def rebound(address: str) -> Membership | None:
    """A new controller on ``address``, once the closed one's socket let it go."""
    try:
        return Membership(SECRET, address, period_s=0.2)
    except zmq.ZMQError:
        return None


def admitted(members: Membership) -> list[AgentState]:
    return [g for g in members.poll(0.05) if isinstance(g, AgentState)]


def test_a_new_controller_asks_the_agent_for_a_hello_and_it_declares_its_ranks() -> None:
    address = f"tcp://127.0.0.1:{free_port()}"
    first = Membership(SECRET, address, period_s=0.2)
    link = AgentLink(address, SECRET, agent="b", node_rank=1, period_s=0.05).start()
    try:
        (hello,) = wait_for(lambda: admitted(first))
        assert wait_for(link.welcomed.is_set)
        link.declare(resume={"attempt": 2, "ranks": [{"rank": 1, "pid": 42, "code": None}]})
        first.close()  # the controller is killed
        wait_for(lambda: not link.connected)
        for _ in range(2000):  # the agent's reports meanwhile: never blocking, some dropped
            link.report("events", {"samples": []})
        assert link.dropped["events"] > 0
        assert link.unreachable_s() > 0
        now = [5000.0]
        second = Membership(SECRET, address, period_s=0.2, clock=lambda: now[0])
        restored = AgentState("b", hello.host, 1, b"", 0.0, 0.0, session=hello.session)
        second.restore([restored], {})
        try:
            (again,) = wait_for(lambda: admitted(second))
            assert (again.agent, again.node_rank, again.session) == ("b", 1, hello.session)
            assert again.info["resume"] == {
                "attempt": 2,
                "ranks": [{"rank": 1, "pid": 42, "code": None}],
            }
            assert second.refused["not_admitted"] >= 1  # what came before its hello
            assert wait_for(lambda: link.connected)
        finally:
            second.close()
    finally:
        link.close()


def test_restored_agents_get_a_fresh_heartbeat_window_on_the_new_clock() -> None:
    now = [9000.0]
    members = Membership(SECRET, period_s=1.0, missed=3, clock=lambda: now[0])
    try:
        members.restore(
            [AgentState("a", "h", 0, b"x", 1.0, 1.0, session="s")],  # seen long ago
            {"old": {"fenced": "lost", "rejoin": "h-spare"}},
        )
        assert members.lost() == []  # no false host loss right after the restart
        now[0] += 1.0
        assert members.lost() == []  # a period of silence: pinged (a loss needs a ping)
        now[0] += 1.99
        assert members.lost() == []
        now[0] += 0.01
        assert [g.agent for g in members.lost()] == ["a"]  # never came back: lost
        assert members.fenced == {"old": "lost"}
        assert members.new_name("h") == "h-spare-2"  # offered names stay taken
    finally:
        members.close()


def store_with(run: Path, **meta: object) -> None:
    run.mkdir()
    store = RunStore(run)
    for key, value in meta.items():
        store.set_meta(key, value)
    store.close()


def test_the_journal_refuses_an_ended_run_or_a_changed_job(tmp_path: Path) -> None:
    running = {"version": 1, "phase": "running", "attempt": 1, "launch": {}, "nodes": {}}
    store_with(tmp_path / "a", config=CONFIG, cluster_state=running)
    assert journal.load(tmp_path / "a", CONFIG) == running
    with pytest.raises(EagleEyeError, match="nnodes=2"):
        journal.load(tmp_path / "a", {**CONFIG, "nnodes": 3})
    store_with(tmp_path / "b", config=CONFIG, cluster_state=running, result={"succeeded": True})
    with pytest.raises(EagleEyeError, match="ended \\(succeeded\\)"):
        journal.load(tmp_path / "b", CONFIG)
    store_with(tmp_path / "c", config={**CONFIG, "recovery": "none"})
    with pytest.raises(EagleEyeError, match="not a job of `eagleeye controller`"):
        journal.load(tmp_path / "c", CONFIG)
    replica = {**CONFIG, "recovery": "replica", "replicas": 2}
    store_with(tmp_path / "e", config=replica)  # a replica job: its own journal
    assert journal.load(tmp_path / "e", replica) is None  # killed before its launch
    with pytest.raises(EagleEyeError, match="was started with replicas=2"):
        journal.load(tmp_path / "e", {**replica, "replicas": 1})
    store_with(tmp_path / "d", config=CONFIG)  # killed before its launch
    assert journal.load(tmp_path / "d", CONFIG) is None


def restored_job(tmp_path: Path, session: str):
    """A coordinator restarted at attempt 1 of a one-host job whose agent is ``a``."""
    members = Membership(SECRET, f"tcp://127.0.0.1:{free_port()}", period_s=0.2)
    (tmp_path / "run").mkdir()
    store = RunStore(tmp_path / "run")
    job = JobCoordinator(members, JobLayout(1, 1), store, journal=lambda j: journal.save(store, j))
    launch = {"attempt": 1, "master_addr": "h", "master_port": 20001, "nnodes": 1}
    state = {
        "version": 1,
        "attempt": 1,
        "phase": "running",
        "launch": {**launch, "nproc_per_node": 1},
        "nodes": {"0": {"agent": "a", "host": "h", "session": session, "info": {}}},
    }
    journal.restore(job, state)
    return job, members, store


def test_an_agent_that_missed_the_current_attempts_launch_is_sent_it(tmp_path: Path) -> None:
    job, members, store = restored_job(tmp_path, "0123456789abcdef")
    link = AgentLink(members.address, SECRET, agent="a", node_rank=0, period_s=0.05)
    link.session = "0123456789abcdef"  # the agent process the job admitted
    link.declare(resume={"attempt": 0, "ranks": [{"rank": 0, "pid": 7, "code": None}]})
    link.start()
    try:

        def restart():
            job._poll()
            return [m for m in link.take() if m.kind == "restart"]

        (sent,) = wait_for(restart)
        assert (sent.body["attempt"], sent.body["master_port"], sent.body["node_rank"]) == (
            1,
            20001,
            0,
        )
        assert job.phase.value == "running"
    finally:
        link.close()
        members.close()
        store.close()


def test_an_agent_of_the_same_name_but_a_new_process_is_not_adopted(tmp_path: Path) -> None:
    job, members, store = restored_job(tmp_path, "0123456789abcdef")
    link = AgentLink(members.address, SECRET, agent="a", node_rank=0, period_s=0.05).start()
    try:

        def stopped():
            job._poll()
            return [m for m in link.take() if m.kind == "stop"]

        (stop,) = wait_for(stopped)
        assert "lost" in stop.body["fenced"]
        assert job.phase.value == "failed"  # no spare: the job stops
    finally:
        link.close()
        members.close()
        store.close()
    with RunReader(tmp_path / "run") as run:
        assert list(run.findings()["kind"]) == ["host_lost"]
        assert run.meta()["cluster_state"]["phase"] == "failed"


def test_a_waiting_spare_joins_a_restarted_controller_again(tmp_path: Path) -> None:
    address = f"tcp://127.0.0.1:{free_port()}"
    first = Membership(SECRET, address, period_s=0.2)
    spare = AgentLink(address, SECRET, agent="s", node_rank=-1, period_s=0.05, info={"spare": True})
    spare.start()
    try:
        wait_for(lambda: admitted(first))
        first.close()  # the controller is killed
        members = wait_for(lambda: rebound(address))  # its port is freed in the background
        (tmp_path / "run").mkdir()
        store = RunStore(tmp_path / "run")
        job = JobCoordinator(members, JobLayout(1, 1), store)
        state = {
            "version": 1,
            "attempt": 0,
            "phase": "running",
            "launch": {},
            "nodes": {"0": {"agent": "a", "host": "h", "session": "s1", "info": {}}},
        }
        journal.restore(job, state)
        try:

            def joined():
                job._poll()
                return job._spares._waiting

            assert list(wait_for(joined)) == ["s"]  # waiting for a node rank again
        finally:
            members.close()
            store.close()
    finally:
        spare.close()


def test_a_restarted_controller_still_keeps_an_evicted_host_out(tmp_path: Path) -> None:
    members = Membership(SECRET, f"tcp://127.0.0.1:{free_port()}", period_s=0.2)
    (tmp_path / "run").mkdir()
    store = RunStore(tmp_path / "run")
    job = JobCoordinator(members, JobLayout(1, 1), store)
    before = {
        "version": 1,
        "attempt": 1,
        "phase": "running",
        "launch": {},
        "nodes": {"0": {"agent": "a", "host": "h", "session": "s1", "info": {}}},
        "evicted": {"bad-host": "host bad-host (node0) evicted: xid 79"},
    }
    journal.restore(job, before)
    assert journal.state_of(job)["evicted"] == before["evicted"]  # written again as read
    spare = AgentLink(
        members.address, SECRET, "s", -1, period_s=0.05, host="bad-host", info={"spare": True}
    )
    spare.start()
    try:

        def told():
            job._poll()
            return [m for m in spare.take() if m.kind == "stop"]

        (stop,) = wait_for(told)
        assert "--readmit" in str(stop.body)
        assert not job._spares._waiting
    finally:
        spare.close()
        members.close()
        store.close()
