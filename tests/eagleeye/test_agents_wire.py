"""The agents' protocol on loopback, with real sockets: a replayed or forged message is
refused and never acted on, and an agent is lost after ``missed`` periods of silence on
the controller's clock (a clock the test moves), pinged first."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import zmq

from eagleeye.agents import (
    AgentLink,
    AgentReport,
    AgentState,
    Membership,
    Message,
    Refused,
    read_secret,
)
from eagleeye.agents.wire import Sequencer, seal, unseal
from eagleeye.errors import EagleEyeError

SECRET = b"0123456789abcdef0123456789abcdef"


def wait_for(check, limit: float = 10.0):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.02)
    raise AssertionError("not seen in time")


def test_a_wrong_secret_a_replay_and_a_broken_message_are_refused() -> None:
    message = Message("heartbeat", "a", "s1", 1)
    frames = seal(SECRET, message)
    assert unseal(SECRET, frames) == message
    with pytest.raises(Refused, match="HMAC") as wrong:
        unseal(b"another secret of the right size", frames)
    assert wrong.value.reason == "auth"
    with pytest.raises(Refused) as short:
        unseal(SECRET, frames[:1])
    assert short.value.reason == "frames"
    sequencer = Sequencer()
    sequencer.check(message)
    with pytest.raises(Refused, match="replay"):
        sequencer.check(message)  # the same seq again
    sequencer.check(Message("hello", "a", "s2", 1))  # the agent restarted: a new session
    with pytest.raises(Refused, match="ended session"):
        sequencer.check(Message("heartbeat", "a", "s1", 9))


def test_the_secret_file_must_hold_a_real_secret(tmp_path: Path) -> None:
    (tmp_path / "short").write_text("abc\n")
    with pytest.raises(EagleEyeError, match="16 or more"):
        read_secret(tmp_path / "short")
    with pytest.raises(EagleEyeError, match="cannot read"):
        read_secret(tmp_path / "none")


def test_an_agent_refuses_control_without_the_secret() -> None:
    router = zmq.Context.instance().socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    link = AgentLink(f"tcp://127.0.0.1:{port}", SECRET, agent="a", period_s=0.1).start()
    try:
        identity = router.recv_multipart()[0]  # its hello
        forged = seal(b"not the job's secret, a guess!!", Message("kill", "controller", "x", 1))
        router.send_multipart([identity, *forged])
        real = seal(SECRET, Message("stop", "controller", "x", 2))
        router.send_multipart([identity, *real])
        got = wait_for(link.take)
        assert [m.kind for m in got] == ["stop"]  # the forged kill never arrives
        assert link.refused["auth"] == 1
    finally:
        link.close()
        router.close(linger=0)


def test_an_agent_is_lost_after_missed_periods_on_the_controllers_clock() -> None:
    now = [1000.0]
    members = Membership(SECRET, period_s=1.0, missed=3, clock=lambda: now[0])
    link = AgentLink(members.address, SECRET, agent="b", node_rank=1, period_s=0.05).start()
    try:
        admitted = wait_for(lambda: members.poll(0.05))
        assert isinstance(admitted[0], AgentState)
        assert (admitted[0].agent, admitted[0].node_rank) == ("b", 1)
        assert wait_for(link.welcomed.is_set)
        link.report("exit", {"rank": 3, "code": -9})
        report = wait_for(lambda: [g for g in members.poll(0.05) if isinstance(g, AgentReport)])
        assert (report[0].kind, report[0].body["rank"]) == ("exit", 3)
    finally:
        link.close()  # the host goes silent
    members.poll(0.2)  # what was on its way
    start = now[0]
    now[0] = start + 1.0
    assert members.lost() == []  # one period: pinged, not lost
    now[0] = start + 2.99
    assert members.lost() == []
    now[0] = start + 3.0
    lost = members.lost()
    assert [(g.agent, g.node_rank) for g in lost] == [("b", 1)]
    assert lost[0].pings >= 1
    assert members.lost() == []  # reported once
    assert members.alive() == []
    members.close()


def test_a_controller_whose_loop_stalled_pings_before_it_judges_a_silence() -> None:
    """The controller's own loop late by several periods (the agent's heartbeats wait
    unread on its socket): its first look pings and loses nobody; once it has read what
    waited, the agent is alive. (It was lost at that first look, pinged that same instant.)"""
    now = [1000.0]
    members = Membership(SECRET, period_s=1.0, missed=3, clock=lambda: now[0])
    link = AgentLink(members.address, SECRET, agent="c", node_rank=0, period_s=0.05).start()
    try:
        admitted = wait_for(lambda: members.poll(0.05))
        assert isinstance(admitted[0], AgentState)
        assert wait_for(link.welcomed.is_set)
        now[0] += 5.0  # the stall: five periods with nothing read
        assert members.lost() == []  # pinged now: no answer could have come
        members.poll(0.2)  # what waited: heartbeats, then the pong
        now[0] += 1.0
        assert members.lost() == []
        assert [a.agent for a in members.alive()] == ["c"]
    finally:
        link.close()
        members.close()
