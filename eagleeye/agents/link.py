"""An agent's side of the controller: hello, heartbeats, and the controller's actions.

``AgentLink`` connects a ZeroMQ DEALER socket to the controller, says ``hello`` (its
host, node rank and what else it declares), then sends a heartbeat every period on its
own thread. It answers pings, and hands the controller's actions (``take``) to whoever
executes them, only when they carry a valid HMAC of the job's secret and are not replays;
anything else is refused, counted and logged, never acted on.

When the controller goes away (killed, its host lost), the link keeps its host's ranks
running: a silent controller is never evidence against them. ZeroMQ reconnects by
itself, every 0.1 s backing off to one heartbeat period at most, and a ZMTP heartbeat
closes a connection whose peer stopped answering for 3 periods (5 s at least), so a
controller host that vanished without closing its sockets is found too. Meanwhile
nothing blocks: a message that cannot be queued (a thousand are already waiting for
the controller) is dropped and counted by kind (``dropped``); only a controller that is
connected but slow is waited for, up to a period per message. The loss of contact is
logged loudly every ten periods. A controller that does not know this agent
(restarted from its run store) asks it to say ``hello`` again (``rehello``): the hello
then carries what the agent runs (``declare``: its attempt, each rank's pid and the exit
codes of those that ended).
"""

from __future__ import annotations

import logging
import secrets
import socket
import threading
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from eagleeye.agents.summary import HostSummary, encode_summary
from eagleeye.agents.wire import MAX_MESSAGE_BYTES, Message, Refused, Sequencer, seal, unseal

log = logging.getLogger(__name__)
#: Periods without a connection to the controller between two loud log lines.
LOUD_EVERY = 10


class AgentLink:
    """Args:
    controller: ``tcp://HOST:PORT`` of the controller's membership socket.
    secret: the job's shared secret.
    agent: this agent's name (default: the hostname).
    node_rank: the node rank of this host's ranks.
    period_s: the heartbeat period.
    info: more of what the agent declares in its hello (its ranks, its GPUs).
    host: this host's name as the controller knows it (default: the hostname).
    """

    def __init__(
        self,
        controller: str,
        secret: bytes,
        agent: str | None = None,
        node_rank: int = 0,
        period_s: float = 1.0,
        info: Mapping[str, Any] | None = None,
        host: str | None = None,
    ) -> None:
        self.controller = controller
        self.info = dict(info or {})
        self.host = host or socket.gethostname()
        self.agent = agent or self.host
        self.secret = secret
        self.period_s = period_s
        self.session = secrets.token_hex(8)
        self.refused: Counter[str] = Counter()
        self._hello = {"host": self.host, "node_rank": node_rank, **dict(info or {})}
        self._seq = 0
        self._lock = threading.Lock()
        self._sequencer = Sequencer()
        self._inbox: list[Message] = []
        self._stop = threading.Event()
        self._context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._socket = self._context.socket(zmq.DEALER)
        self._socket.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        self._socket.setsockopt(zmq.LINGER, 1000)
        period_ms = max(int(period_s * 1000), 100)
        self._socket.setsockopt(zmq.RECONNECT_IVL, 100)
        self._socket.setsockopt(zmq.RECONNECT_IVL_MAX, period_ms)
        self._socket.setsockopt(zmq.HEARTBEAT_IVL, period_ms)
        self._socket.setsockopt(zmq.HEARTBEAT_TIMEOUT, max(3 * period_ms, 5000))
        self._monitor = self._socket.get_monitor_socket(
            zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED
        )
        self._socket.connect(controller)
        self.dropped: Counter[str] = Counter()  # messages the link could not queue, by kind
        self.declared: Mapping[str, Any] = {}  # what the agent runs, said in a hello again
        self.connected = False  # a connection to the controller is up
        self._down_since = time.monotonic()  # when the last connection went down
        self._loud_at = self._down_since
        self.controller_session: str | None = None  # the controller's, from its welcome
        self._thread = threading.Thread(target=self._loop, name="eagleeye-agent", daemon=True)
        self.welcomed = threading.Event()

    def start(self) -> AgentLink:
        self._send("hello", self._hello)
        self._thread.start()
        return self

    def declare(self, node_rank: int | None = None, **declared: Any) -> None:
        """What this agent runs, said when the controller asks for a hello again: its node
        rank once a launch gave it one (a spare's), and ``declared`` (``resume``: the
        attempt and its ranks). Called from the agent's thread; the link's reads a whole
        mapping, replaced at once."""
        if node_rank is not None:
            self._hello = {**self._hello, "node_rank": node_rank, "spare": False}
        self.declared = {**self.declared, **declared}

    def unreachable_s(self) -> float:
        """Seconds since the connection to the controller went down (0 while up)."""
        return 0.0 if self.connected else time.monotonic() - self._down_since

    def rejoin(self, agent: str, **info: Any) -> AgentLink:
        """A new link of this host to the same controller, as the spare ``agent`` (a new
        connection and session, no node rank, ``info`` added to the hello), not started."""
        declared = {**self.info, "spare": True, **info}
        return AgentLink(
            self.controller, self.secret, agent, -1, self.period_s, declared, self.host
        )

    def report(self, kind: str, body: Mapping[str, Any]) -> None:
        """Tells the controller something (a rank's exit, an action's outcome)."""
        self._send(kind, body)

    def summary(self, summary: HostSummary) -> int:
        """Sends one step's host summary (the compact binary message); returns its size."""
        with self._lock:
            self._seq += 1
            frames = encode_summary(summary, self.secret, self.session, self._seq)
            self._put(frames, "summary")
        return len(frames[0])

    def take(self) -> list[Message]:
        """The controller's verified messages since the last call (welcome, actions)."""
        with self._lock:
            taken, self._inbox = self._inbox, []
        return taken

    def _send(self, kind: str, body: Mapping[str, Any]) -> None:
        with self._lock:  # one socket, two threads: sends are serialised
            self._seq += 1
            frames = seal(self.secret, Message(kind, self.agent, self.session, self._seq, body))
            self._put(frames, kind)

    def _put(self, frames: list[bytes], kind: str) -> None:
        """Queues a message for the controller (the lock held). With the queue full, a
        connected controller (only slow) is waited for up to one period; one that is
        away is not: the message is dropped and counted."""
        try:
            self._socket.send_multipart(frames, zmq.NOBLOCK)
            return
        except zmq.Again:
            pass
        wait_ms = int(self.period_s * 1000) if self.connected else 0
        try:
            if wait_ms and self._socket.poll(wait_ms, zmq.POLLOUT):
                self._socket.send_multipart(frames, zmq.NOBLOCK)
                return
        except zmq.Again:
            pass
        self.dropped[kind] += 1
        if sum(self.dropped.values()) in (1, 100, 10000):
            log.warning(
                "the controller takes no messages (%s); dropped so far: %s",
                self.controller,
                dict(self.dropped),
            )

    def _loop(self) -> None:
        next_beat = 0.0
        poller = zmq.Poller()
        with self._lock:
            poller.register(self._socket, zmq.POLLIN)
        poller.register(self._monitor, zmq.POLLIN)
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_beat:
                self._send("heartbeat", {})
                next_beat = now + self.period_s
            with self._lock:
                ready = dict(poller.poll(timeout=0))
            if self._monitor in ready:
                self._watch_connection()
            if self._socket in ready:
                self._receive()
            self._loud(now)
            self._stop.wait(min(0.05, max(next_beat - time.monotonic(), 0.0)))

    def _receive(self) -> None:
        while True:
            with self._lock:
                try:
                    frames = self._socket.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    return
            try:
                message = unseal(self.secret, frames)
                if message.sender != "controller":
                    raise Refused(f"a message from {message.sender}, not the controller", "auth")
                self._sequencer.check(message)
            except Refused as exc:
                self.refused[exc.reason] += 1
                if self.refused[exc.reason] <= 8:
                    log.warning("refused a message from the controller's side: %s", exc)
                continue
            if message.kind == "ping":
                self._send("pong", {})
            elif message.kind == "rehello":  # a controller that does not know this agent
                self._send("hello", {**self._hello, **self.declared})
            elif message.kind == "welcome":
                if self.controller_session not in (None, message.session):
                    log.warning(
                        "a new controller (session %s) took this agent back; its ranks "
                        "ran on meanwhile",
                        message.session,
                    )
                self.controller_session = message.session
                self.welcomed.set()
            else:
                with self._lock:
                    self._inbox.append(message)

    def _watch_connection(self) -> None:
        """The connection's events: up, or down since now."""
        while self._monitor.poll(0):
            event = recv_monitor_message(self._monitor)["event"]
            if event == zmq.EVENT_CONNECTED:
                self.connected = True
            elif event == zmq.EVENT_DISCONNECTED and self.connected:
                self.connected = False
                self._down_since = self._loud_at = time.monotonic()
                log.warning(
                    "lost the connection to the controller %s; this host's ranks keep "
                    "running, retrying",
                    self.controller,
                )

    def _loud(self, now: float) -> None:
        """Every ``LOUD_EVERY`` periods without a controller, one loud line."""
        if self.connected or now - self._loud_at < LOUD_EVERY * self.period_s:
            return
        self._loud_at = now
        log.error(
            "no controller at %s for %.0f s: this host's ranks keep running (a silent "
            "controller is no evidence against them); retrying every %.1f s at most; "
            "messages dropped meanwhile: %s",
            self.controller,
            now - self._down_since,
            self.period_s,
            dict(self.dropped),
        )

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self._socket.disable_monitor()
        self._monitor.close(linger=0)
        self._socket.close()


__all__ = ["AgentLink"]
