"""The checkpoint action remediation calls, and a watcher of state changes.

A CHECKPOINT action asks every holder of the ring for a save at the next step boundary
(trainers see it through :meth:`CheckpointClient.save_requested`) and for the next snapshot
to be persisted whatever the persistence period says. The action's key makes it idempotent.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import zmq

from ft_runtime.ckpt._rpc import Rpc
from ft_runtime.ckpt.config import Ring
from ft_runtime.ckpt.types import StateChange
from ft_runtime.errors import CheckpointError
from ft_runtime.types import Action, ActionKind, Outcome, OutcomeStatus


class CheckpointRuntime:
    """Executes CHECKPOINT actions against a ring of holders; other kinds are SKIPPED.

    Satisfies :class:`ft_runtime.base.Runtime`, so a composite runtime can route to it.
    """

    def __init__(
        self,
        ring: Ring,
        timeout: timedelta = timedelta(seconds=2),
        clock: Callable[[], float] = time.time,
        token: str = "",
    ) -> None:
        self.ring, self.timeout, self.clock = ring, timeout, clock
        self.token = token

    def execute(self, action: Action) -> Outcome:
        if action.kind != ActionKind.CHECKPOINT:
            return Outcome(action, OutcomeStatus.SKIPPED, "not a checkpoint action", self.clock())
        ctx: zmq.Context[Any] = zmq.Context.instance()
        asked: list[str] = []
        dup: list[str] = []
        failed: list[str] = []
        for node, ep in self.ring.nodes:
            rpc = Rpc(ctx, ep, self.timeout.total_seconds(), self.token)
            try:
                head, _ = rpc.call({"op": "request", "key": action.key})
                (dup if head["duplicate"] else asked).append(node)
            except CheckpointError as exc:
                failed.append(f"{node}: {exc}")
            finally:
                rpc.close()
        if not asked and not dup:
            return Outcome(action, OutcomeStatus.FAILED, "; ".join(failed), self.clock())
        if not asked:
            return Outcome(
                action, OutcomeStatus.SKIPPED, f"duplicate key {action.key!r}", self.clock()
            )
        detail = f"save requested on {', '.join(asked)}"
        if failed:
            detail += f"; unreachable: {'; '.join(failed)}"
        return Outcome(action, OutcomeStatus.DONE, detail, self.clock())


class StateWatcher:
    """Polls holders for the state changes of their own snapshots.

    Call :meth:`poll` periodically (the controller's loop); each new StateChange is passed
    to ``callback`` exactly once per holder lifetime.
    """

    def __init__(
        self,
        ring: Ring,
        callback: Callable[[StateChange], None],
        timeout: timedelta = timedelta(seconds=1),
        token: str = "",
    ) -> None:
        self.callback = callback
        ctx: zmq.Context[Any] = zmq.Context.instance()
        t = timeout.total_seconds()
        self._rpcs = {n: Rpc(ctx, ep, t, token) for n, ep in ring.nodes}
        self._since = {n: 0 for n, _ in ring.nodes}
        self._pid: dict[str, int] = {}

    def poll(self) -> int:
        """Delivers new changes from every reachable holder; returns how many."""
        count = 0
        for node, rpc in self._rpcs.items():
            try:
                ping, _ = rpc.call({"op": "ping"})
                if self._pid.get(node) != ping["pid"]:  # a restarted holder counts from 0
                    self._pid[node], self._since[node] = ping["pid"], 0
                head, _ = rpc.call({"op": "events", "since": self._since[node]})
            except CheckpointError:
                continue
            for ev in map(StateChange.from_json, head["events"]):
                self._since[node] = max(self._since[node], ev.seq)
                self.callback(ev)
                count += 1
        return count

    def close(self) -> None:
        for rpc in self._rpcs.values():
            rpc.close()
