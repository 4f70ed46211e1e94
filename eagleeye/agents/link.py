"""An agent's side of the controller: hello, heartbeats, and the controller's actions.

``AgentLink`` connects a ZeroMQ DEALER socket to the controller, says ``hello`` (its
host, node rank and what else it declares), then sends a heartbeat every period on its
own thread. It answers pings, and hands the controller's actions (``take``) to whoever
executes them, only when they carry a valid HMAC of the job's secret and are not replays;
anything else is refused, counted and logged, never acted on.
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

from eagleeye.agents.summary import HostSummary, encode_summary
from eagleeye.agents.wire import MAX_MESSAGE_BYTES, Message, Refused, Sequencer, seal, unseal

log = logging.getLogger(__name__)


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
        self._socket.connect(controller)
        self._thread = threading.Thread(target=self._loop, name="eagleeye-agent", daemon=True)
        self.welcomed = threading.Event()

    def start(self) -> AgentLink:
        self._send("hello", self._hello)
        self._thread.start()
        return self

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
            self._socket.send_multipart(frames)
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
            self._socket.send_multipart(frames)

    def _loop(self) -> None:
        next_beat = 0.0
        poller = zmq.Poller()
        with self._lock:
            poller.register(self._socket, zmq.POLLIN)
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_beat:
                self._send("heartbeat", {})
                next_beat = now + self.period_s
            with self._lock:
                ready = dict(poller.poll(timeout=0))
            if self._socket in ready:
                self._receive()
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
            elif message.kind == "welcome":
                self.welcomed.set()
            else:
                with self._lock:
                    self._inbox.append(message)

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self._socket.close()


__all__ = ["AgentLink"]
