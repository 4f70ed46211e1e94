"""The controller's side of the agents: who is in the job, and who was lost.

``Membership`` binds a ZeroMQ ROUTER socket on an explicit address (loopback by default)
and admits agents that say ``hello`` with the job's shared secret. It stamps every message
with the controller's own clock: an agent's heartbeat period is the controller's to judge,
never the agent's clock. An agent is lost when nothing at all came from it (heartbeats,
reports, replies to the controller's pings) for ``missed`` periods, and a ping sent a
period before at least went unanswered: the pings are the evidence that the silence is
the host's, not a quiet moment nor a stall of the controller's own loop. A refused message (no or a
wrong secret, a replay, a broken schema) is counted by reason, logged (the first few per
reason) and never acted on; a sender is never admitted by one. An agent fenced
(``fence``: its host was lost or evicted, its node rank given to a spare) is never
admitted again: whatever it sends later is refused (reason ``fenced``) and answered with
a ``stop``, so a host whose link comes back ends its ranks; the stop may name a new agent
under which it is to say ``hello`` again as a spare (``rejoin``) once they ended, or say
that the host was evicted (``evicted``: its agent stays out); an agent that left on a
signal and whose node rank went to a spare is told it was ``drained``. A spare
(an agent that says ``hello`` without a node rank, ``node_rank`` -1) is given one with
``assign``.

A genuine message (valid HMAC) from a connection that is not admitted (an agent whose
link reconnected, or whose controller was restarted from its run store) is answered with
``rehello``, at most once a period per connection: the agent says ``hello`` again with
what it runs. A restarted controller knows the agents it had admitted (``restore``):
each is given a fresh heartbeat window on the new controller's clock, so it is lost only
if it stays silent ``missed`` periods from then.
"""

from __future__ import annotations

import logging
import math
import secrets
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from operator import attrgetter, itemgetter, methodcaller
from typing import TYPE_CHECKING, Any, cast

import zmq

from collector.types import Subject
from detectors.types import Finding, Severity
from eagleeye.agents.summary import MAGIC, summary_mac
from eagleeye.agents.wire import MAX_MESSAGE_BYTES, Message, Refused, Sequencer, seal, unseal

if TYPE_CHECKING:
    from eagleeye.agents.intake import SummaryIntake

log = logging.getLogger(__name__)
#: Messages taken off the socket at most per ``poll`` before they are handled.
MAX_DRAIN = 1 << 16


@dataclass
class AgentState:
    """One admitted agent as the controller sees it."""

    agent: str
    host: str
    node_rank: int
    identity: bytes
    admitted_at: float
    last_seen: float
    lost_at: float | None = None
    info: dict[str, Any] = field(default_factory=dict)
    slot: int = -1  # the agent's slot in the controller's replay check
    session: str = ""  # the session of its hello (an agent process's own)


@dataclass(frozen=True, slots=True)
class AgentLost:
    """An agent silent for ``missed`` periods despite the controller's pings."""

    agent: str
    host: str
    node_rank: int
    last_seen: float
    at: float
    pings: int

    def finding(self) -> Finding:
        """The critical ``host_lost`` finding on its node, with the silence as evidence."""
        evidence = {"silent_s": self.at - self.last_seen, "pings": float(self.pings)}
        node = Subject(node=f"node{self.node_rank}")
        return Finding(
            "host_lost", node, 1.0, Severity.CRITICAL, self.at, None, evidence, "agent_heartbeat"
        )


@dataclass(frozen=True, slots=True)
class AgentReport:
    """Something an admitted agent reported (a rank's exit, an action's outcome)."""

    agent: str
    kind: str
    body: Mapping[str, Any]
    at: float


MAX_ENDED_AGO_S = 60.0


def ended_ago_s(body: Mapping[str, Any]) -> float:
    """How long before its report a rank's process ended (``ended_s_ago``, measured by
    its agent's waiter on the agent's own clock): a number in [0, 60] s, else 0."""
    ago = body.get("ended_s_ago")
    if isinstance(ago, bool) or not isinstance(ago, int | float) or not math.isfinite(ago):
        return 0.0
    return min(max(float(ago), 0.0), MAX_ENDED_AGO_S)


def first_ended_first(
    items: list[AgentState | AgentReport],
) -> list[AgentState | AgentReport]:
    """The items of one poll with their rank exits in the order the processes ended (the
    others keep their places). A rank killed takes its peers down a moment later (their
    collective resets); reported in one look, or by two hosts in one poll, in the order
    they arrived, a peer could be taken for the job's first failure."""
    slots = [i for i, x in enumerate(items) if isinstance(x, AgentReport) and x.kind == "exit"]
    exits = sorted((cast(AgentReport, items[i]) for i in slots), key=_age, reverse=True)
    ordered = list(items)
    for slot, got in zip(slots, exits, strict=True):
        ordered[slot] = got
    return ordered


def _age(report: AgentReport) -> float:
    return ended_ago_s(report.body)


class Membership:
    """Args:
    secret: the job's shared secret.
    address: ``tcp://ADDR:PORT`` to bind (an explicit address; loopback by default).
    period_s: the agents' heartbeat period.
    missed: periods of silence that lose an agent.
    clock: the controller's clock.
    """

    def __init__(
        self,
        secret: bytes,
        address: str = "tcp://127.0.0.1:0",
        period_s: float = 1.0,
        missed: int = 3,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.secret = secret
        self.period_s = period_s
        self.missed = missed
        self.clock = clock
        self.session = secrets.token_hex(8)
        self.agents: dict[str, AgentState] = {}
        self.intake: SummaryIntake | None = None  # where host summaries go (None: refused)
        self._summary_mac = summary_mac(secret)
        self._by_identity: dict[bytes, AgentState] = {}
        self._lost_connections = 0  # lost agents in ``_by_identity``
        self.refused: Counter[str] = Counter()
        self._seq = 0
        self._sequencer = Sequencer()
        self._pinged: dict[str, float] = {}  # agent -> its last ping in this silence
        self._first_ping: dict[str, float] = {}  # agent -> its first ping in this silence
        self._pings: Counter[str] = Counter()  # pings in this silence
        self.fenced: dict[str, str] = {}  # agent -> why: refused, told to stop, for good
        self._fence_told: dict[str, float] = {}  # when a fenced agent was last told to stop
        self._fence_stop: dict[str, dict[str, Any]] = {}  # what a fenced agent is told
        self._asked: dict[bytes, float] = {}  # when a connection was asked for a hello again
        self._context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._socket = self._context.socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        self._socket.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self._socket.setsockopt(zmq.LINGER, 0)
        host, _, port = address.rpartition(":")
        if port == "0":
            self.address = f"{host}:{self._socket.bind_to_random_port(host)}"
        else:
            self._socket.bind(address)
            self.address = address

    # ---- receiving ------------------------------------------------------------------------
    def poll(self, timeout_s: float = 0.0) -> list[AgentState | AgentReport]:
        """Takes every message that arrived (waiting up to ``timeout_s`` for the first):
        newly admitted agents and their reports, in order."""
        if not self._socket.poll(int(timeout_s * 1000)):
            return []
        messages: list[list[bytes]] = []
        while len(messages) < MAX_DRAIN:
            try:
                messages.append(self._socket.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                break
        return self.receive_all(messages)

    def receive(self, frames: list[bytes]) -> AgentState | AgentReport | None:
        """One message as the socket delivers it (the sender's connection, then the
        message's frames): an agent admitted, a report, or None (a heartbeat, a summary
        handed to the intake, or a message refused)."""
        got = self.receive_all([frames])
        return got[0] if got else None

    def receive_all(self, messages: list[list[bytes]]) -> list[AgentState | AgentReport]:
        """Messages as the socket delivered them: the agents admitted and the reports.

        Host summaries are taken together (``_summaries``), after the other messages.
        Each connection's messages are handled in the order it sent them: a message that
        follows a summary of its own connection is held back until the summaries are
        taken (with whatever that connection sent after it), and a message from a
        connection not admitted (a hello) has everything before it handled first. So
        other agents' heartbeats never split a step's summaries.
        """
        if _all_summaries(messages):  # a step's summaries and nothing else: the hot path
            self._summaries(messages)
            return []
        out: list[AgentState | AgentReport] = []
        summaries: list[list[bytes]] = []
        later: list[list[bytes]] = []  # held back behind a summary of their connection
        waiting: set[bytes] = set()  # connections with a summary in ``summaries``
        held: set[bytes] = set()  # connections with a message in ``later``
        for frames in messages:
            identity = frames[0]
            if identity in held:
                later.append(frames)
                continue
            if len(frames) == 3 and frames[1][:4] == MAGIC:  # a host summary, the hot path
                summaries.append(frames)
                waiting.add(identity)
                continue
            if identity in waiting:
                later.append(frames)
                held.add(identity)
                continue
            if identity not in self._by_identity and (summaries or later):
                out += self._flush(summaries, later)
                summaries, later = [], []
                waiting.clear()
                held.clear()
            try:
                message = unseal(self.secret, frames[1:])
                self._sequencer.check(message)
            except Refused as exc:
                self._refuse(exc, identity)
                continue
            got = self._take(identity, message)
            if got is not None:
                out.append(got)
        return out + self._flush(summaries, later)

    def _flush(
        self, summaries: list[list[bytes]], later: list[list[bytes]]
    ) -> list[AgentState | AgentReport]:
        """The summaries taken, then the messages held back behind them."""
        if summaries:
            self._summaries(summaries)
        return self.receive_all(later) if later else []

    def _take(self, identity: bytes, message: Message) -> AgentState | AgentReport | None:
        now = self.clock()
        if message.sender in self.fenced:
            self._refuse(Refused(f"{message.sender} is fenced", "fenced"), identity)
            if now - self._fence_told.get(message.sender, -math.inf) >= self.period_s:
                self._fence_told[message.sender] = now  # its link came back: end its ranks
                self._send_to(identity, "stop", self._fence_stop[message.sender])
            return None
        if message.kind == "hello":
            return self._admit(identity, message, now)
        state = self.agents.get(message.sender)
        if state is None or state.identity != identity:
            self._refuse(Refused(f"{message.sender} is not admitted", "not_admitted"), identity)
            self._ask_hello(identity, now)
            return None
        state.last_seen = now
        self._heard(message.sender)
        if message.kind in ("heartbeat", "pong"):
            return None
        return AgentReport(message.sender, message.kind, message.body, now)

    def _summaries(self, messages: list[list[bytes]]) -> None:
        """Host summaries (connection, payload, MAC), in the order they came: each one's
        sender admitted and its MAC checked, one by one; then all parsed and checked at
        once (``summarybatch.parse_payloads``), their sequence numbers checked against
        replays at once, in order (``summarybatch.check_replays``), and the rest handed
        to the intake. A refused one is counted and logged and never used."""
        import numpy as np  # here: an agent's side imports this module without numpy

        from eagleeye.agents.summarybatch import check_replays, parse_payloads

        now = self.clock()
        states = list(map(self._by_identity.get, map(itemgetter(0), messages)))
        payloads = list(map(itemgetter(1), messages))
        genuine = list(map(self._summary_mac.verify, payloads, map(itemgetter(2), messages)))
        if self._lost_connections or None in states:
            senders = [s for s in states if s is not None and s.lost_at is None]
        else:
            senders = cast(list[AgentState], states)  # every one admitted, none lost
        if len(senders) < len(messages) or not all(genuine):  # some refused: one by one
            senders, kept = [], []
            for frames, state, payload, ok in zip(messages, states, payloads, genuine, strict=True):
                if not ok:
                    why = Refused("a summary without a valid MAC of the shared secret", "auth")
                elif state is None or state.lost_at is not None:
                    why = Refused("a summary from a connection not admitted", "not_admitted")
                    self._ask_hello(frames[0], now)
                else:
                    senders.append(state)
                    kept.append(payload)
                    continue
                self._refuse(why, frames[0])
            payloads = kept
        for state in senders:  # the agent's own messages: it is alive
            state.last_seen = now
        if self._pinged:
            for state in senders:
                self._heard(state.agent)
        if not payloads:
            return
        blocks, refused = parse_payloads(payloads)
        for at, why in refused:
            self._refuse(why, senders[at].identity)
        count = len(senders)
        slots = np.fromiter(map(attrgetter("slot"), senders), np.int64, count)
        nodes = np.fromiter(map(attrgetter("node_rank"), senders), np.int64, count)
        blocks, replays = check_replays(self._sequencer, senders, slots, blocks)
        for at, why in replays:
            self._refuse(why, senders[at].identity)
        for block in blocks:
            if self.intake is None:
                for at in block.index.tolist():
                    why = Refused("a summary where none is taken", "unexpected")
                    self._refuse(why, senders[at].identity)
                continue
            for at, why in self.intake.take_block(nodes[block.index], block, now):
                self._refuse(why, senders[at].identity)

    def _admit(self, identity: bytes, message: Message, now: float) -> AgentState:
        body = message.body
        state = AgentState(
            agent=message.sender,
            host=str(body.get("host", "")),
            node_rank=int(body.get("node_rank", -1)),
            identity=identity,
            admitted_at=now,
            last_seen=now,
            info=dict(body),
            slot=self._sequencer.slot(message.sender),
            session=message.session,
        )
        old = self.agents.get(message.sender)
        if old is not None and self._by_identity.pop(old.identity, None) is old:
            self._lost_connections -= old.lost_at is not None
        replaced = self._by_identity.get(identity)
        if replaced is not None and replaced.lost_at is not None:
            self._lost_connections -= 1
        self.agents[message.sender] = state
        self._by_identity[identity] = state
        self._heard(message.sender)
        self.send(message.sender, "welcome", {"period_s": self.period_s})
        log.info("agent %s on %s admitted (node rank %d)", state.agent, state.host, state.node_rank)
        return state

    def _heard(self, agent: str) -> None:
        """Something came from ``agent``: its silence, and the pings into it, ended."""
        self._pinged.pop(agent, None)
        self._first_ping.pop(agent, None)
        self._pings.pop(agent, None)

    def _ask_hello(self, identity: bytes, now: float) -> None:
        """Asks a connection that sent a genuine message but is not admitted to say
        ``hello`` again (once a period)."""
        if now - self._asked.get(identity, -math.inf) < self.period_s:
            return
        if len(self._asked) >= MAX_DRAIN:
            self._asked.clear()
        self._asked[identity] = now
        self._send_to(identity, "rehello", {})

    def restore(self, agents: list[AgentState], fenced: Mapping[str, Mapping[str, str]]) -> None:
        """A restarted controller's memory: the agents it had admitted (no connection
        until each says ``hello`` again, each with a fresh heartbeat window on this
        clock) and the agents it had fenced (agent -> what it is told)."""
        now = self.clock()
        for state in agents:
            state.identity, state.admitted_at, state.last_seen = b"", now, now
            self.agents[state.agent] = state
        for agent, stop in fenced.items():
            self.fenced[agent] = next(iter(stop.values()), "fenced")
            self._fence_stop[agent] = dict(stop)
            self._fence_told[agent] = now

    def fence_stops(self) -> dict[str, dict[str, str]]:
        """Every fenced agent and what it is told (a restarted controller's to restore)."""
        return {agent: dict(stop) for agent, stop in self._fence_stop.items()}

    def _refuse(self, exc: Refused, identity: bytes) -> None:
        self.refused[exc.reason] += 1
        if self.refused[exc.reason] <= 8:
            log.warning(
                "refused a message (connection %s): %s; not acted on", identity.hex()[:16], exc
            )

    # ---- judging --------------------------------------------------------------------------
    def lost(self) -> list[AgentLost]:
        """Agents that went silent: pinged after one period of silence, lost after
        ``missed`` periods with no answer to a ping sent a period before at least. A
        controller whose own loop stalled (what the agents sent waits unread on its
        socket) so pings first and judges a period later, after reading what waited; it
        does not lose every agent at its first look. Each is reported once."""
        now = self.clock()
        lost = []
        for state in self.agents.values():
            if state.lost_at is not None:
                continue
            silent = now - state.last_seen
            if (
                silent >= self.period_s
                and now - self._pinged.get(state.agent, 0.0) >= self.period_s
            ):
                self._pinged[state.agent] = now
                self._first_ping.setdefault(state.agent, now)
                self._pings[state.agent] += 1
                self.send(state.agent, "ping", {})
            asked = self._first_ping.get(state.agent)
            if (
                silent >= self.missed * self.period_s
                and asked is not None
                and now - asked >= self.period_s
            ):
                state.lost_at = now
                self._lost_connections += self._by_identity.get(state.identity) is state
                lost.append(
                    AgentLost(
                        state.agent,
                        state.host,
                        state.node_rank,
                        state.last_seen,
                        now,
                        self._pings[state.agent],
                    )
                )
        return lost

    def alive(self) -> list[AgentState]:
        return [s for s in self.agents.values() if s.lost_at is None]

    def fence(
        self,
        agent: str,
        why: str,
        key: str = "fenced",
        rejoin: str | None = None,
        evicted: bool = False,
    ) -> None:
        """Puts ``agent`` out of the job for good: told to stop its ranks now (``{key:
        why}``, delivered when its link comes back), every later message refused and
        answered with a stop, never admitted again (its hello included). With ``rejoin``
        the stop also names the new agent under which the host may join again as a spare
        once its ranks ended (a new session, a new connection, no node rank). With
        ``evicted`` the stop says the host was evicted (its agent stays out)."""
        self.fenced[agent] = why
        stop: dict[str, Any] = {key: why}
        if rejoin is not None:
            stop["rejoin"] = rejoin
        if evicted:
            stop["evicted"] = True
        self._fence_stop[agent] = stop
        state = self.agents.get(agent)
        if state is not None and state.lost_at is None:
            state.lost_at = self.clock()
        self._fence_told[agent] = self.clock()
        self.send(agent, "stop", stop)

    def new_name(self, host: str) -> str:
        """A name for an agent of ``host`` that no agent has had in this job, nor was
        offered (``{host}-spare``, else ``{host}-spare-2``, ...)."""
        offered = {stop.get("rejoin") for stop in self._fence_stop.values()}
        name, n = f"{host}-spare", 1
        while name in self.agents or name in self.fenced or name in offered:
            n += 1
            name = f"{host}-spare-{n}"
        return name

    def assign(self, agent: str, node_rank: int) -> None:
        """Gives the admitted spare ``agent`` the node rank ``node_rank`` (its summaries
        and losses are that node's from now on)."""
        self.agents[agent].node_rank = node_rank

    # ---- sending --------------------------------------------------------------------------
    def send(self, agent: str, kind: str, body: Mapping[str, Any]) -> bool:
        """Sends ``kind`` to an admitted agent; False when it is not connected."""
        state = self.agents.get(agent)
        if state is None:
            return False
        return self._send_to(state.identity, kind, body)

    def _send_to(self, identity: bytes, kind: str, body: Mapping[str, Any]) -> bool:
        self._seq += 1
        frames = seal(self.secret, Message(kind, "controller", self.session, self._seq, body))
        try:
            self._socket.send_multipart([identity, *frames], zmq.NOBLOCK)
        except (zmq.Again, zmq.ZMQError):
            return False
        return True

    def close(self) -> None:
        self._socket.close(linger=0)


def _all_summaries(messages: list[list[bytes]]) -> bool:
    """Whether every message is a host summary's three frames (checked in C loops)."""
    if not messages or set(map(len, messages)) != {3}:
        return False
    return all(map(_summary_magic, map(itemgetter(1), messages)))


_summary_magic = methodcaller("startswith", MAGIC)


__all__ = ["AgentLost", "AgentReport", "AgentState", "Membership"]
