"""Non-blocking catch-up: a restarted replica gets up to date before anyone waits for it.

The joiner asks a healthy source replica for its state (``q/wants`` counts requests,
``q/want/<n>`` names the joiner and the source; ``protocol`` encodes them). Each source
rank, at its next step boundary, copies its state into its snapshot server (a memory
copy), and from then on logs the update it applies at every step (the averaged gradient
and the learning rate). The
joiner fetches the snapshot, replays the logged updates, which gives it exactly the
source's parameters, and only when it has reached the head of the log does it ask the
quorum to admit it. The healthy replicas wait for it at most for the last step or two of
replay and the set-up of the new group, instead of the whole state transfer.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ft_runtime import _dist as dist
from ft_runtime.catchup import SnapshotServer, fetch_snapshot, fetch_update
from ft_runtime.errors import CatchUpError, LeftQuorum
from ft_runtime.replica.protocol import (
    KEY_CATCHUP_COUNT,
    CatchUpDone,
    CatchUpRequest,
    CatchUpTicket,
    ProtocolError,
    ServerAddress,
    decode,
    decode_counter,
    encode,
    key_address,
    key_catchup,
    key_catchup_done,
    key_catchup_ticket,
)

Apply = Callable[[torch.Tensor, float], object]
MAX_LOG = 1024  # updates kept for one joiner; beyond it the joiner restarts its catch-up


class CatchUpSource:
    """The healthy side: answers catch-up requests addressed to its replica."""

    def __init__(
        self,
        store: dist.Store,
        server: SnapshotServer,
        replica: int,
        state_fn: Callable[[], Mapping[str, Any]],
    ) -> None:
        self.store, self.server, self.replica = store, server, replica
        self.state_fn = state_fn
        # requests to earlier incarnations are done
        self._seen = decode_counter(str(store.add(KEY_CATCHUP_COUNT, 0)))
        # open request -> (its replica, that replica's incarnation, the snapshot's step)
        self._open: dict[int, tuple[int, int, int]] = {}

    def after_step(self, step: int, update: torch.Tensor, lr: float) -> None:
        """Logs this step's update for open requests, then takes new requests."""
        if self._open:
            self.server.log_update(step, update, lr)
            self._close_done()
        count = decode_counter(str(self.store.add(KEY_CATCHUP_COUNT, 0)))
        for want in range(self._seen + 1, count + 1):
            key = key_catchup(want)
            if not self.store.check([key]):
                break  # counted, not written yet: looked at again after the next step
            self._seen = want
            try:
                request = decode(CatchUpRequest, self.store.get(key))
            except ProtocolError:
                continue  # never acted on
            if request.source == self.replica:
                self._supersede(request)
                self._open[want] = (request.replica, request.incarnation, step + 1)
                self.server.publish(f"w{want}", step + 1, self.state_fn())
                self._prune()
                say(
                    f"replica {self.replica} serves catch-up request {want} of replica "
                    f"{request.replica} (incarnation {request.incarnation}) from step {step + 1}"
                )

    @property
    def serving(self) -> bool:
        """Whether a joiner is catching up from this rank right now."""
        return bool(self._open)

    def _close_done(self) -> None:
        for want in [w for w in self._open if self.store.check([key_catchup_done(w)])]:
            del self._open[want]
        self._prune()

    def _supersede(self, request: CatchUpRequest) -> None:
        """A joiner's next incarnation asks again: the request of an earlier one (which
        died during its catch-up, so never says done) is closed."""
        for want, (replica, incarnation, _) in list(self._open.items()):
            if replica == request.replica and incarnation < request.incarnation:
                del self._open[want]

    def _prune(self) -> None:
        """Keeps only the logged updates an open request still needs (from its snapshot on)."""
        if not self._open or len(self.server.log) > MAX_LOG:
            self.server.log = {}
            return
        first = min(start for _, _, start in self._open.values())
        self.server.log = {s: u for s, u in self.server.log.items() if s >= first}


class CatchUpClient:
    """The restarted side: snapshot, replay, then ready to be admitted."""

    def __init__(self, store: dist.Store, replica: int, replica_rank: int, token: str = "") -> None:
        self.store, self.replica, self.replica_rank = store, replica, replica_rank
        self.token = token
        self.want = 0
        self.address = ""

    def request(self, source: int, source_rank: int, incarnation: int) -> None:
        """Asks ``source`` for its state (rank 0 of the replica asks; all ranks read)."""
        key = key_catchup_ticket(self.replica, incarnation)
        if self.replica_rank == 0:
            want = decode_counter(str(self.store.add(KEY_CATCHUP_COUNT, 1)))
            request = CatchUpRequest(self.replica, incarnation, source)
            self.store.set(key_catchup(want), encode(request))
            self.store.set(key, encode(CatchUpTicket(want)))
        self.store.wait([key])
        self.want = decode(CatchUpTicket, self.store.get(key)).number
        self.address = decode(ServerAddress, self.store.get(key_address(source_rank))).address
        say(
            f"replica {self.replica} (incarnation {incarnation}) catches up from replica "
            f"{source}: request {self.want}"
        )

    def snapshot(self, deadline: float) -> tuple[int, dict[str, Any]]:
        """The source's state and the step it is the start of."""
        while True:  # the source publishes at its next step boundary: retry until then
            try:
                return fetch_snapshot(self.address, f"w{self.want}", self.token)
            except CatchUpError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)

    def replay(self, step: int, until: int | None, apply: Apply, deadline: float) -> int:
        """Applies the logged updates from ``step``: up to ``until`` (exclusive), or while
        they are there when ``until`` is None. Returns the next step to apply."""
        while until is None or step < until:
            entry = fetch_update(self.address, step, self.token)
            if entry is None:
                if until is None:
                    return step
                if time.monotonic() > deadline:
                    raise LeftQuorum(f"update {step} never appeared at {self.address}")
                time.sleep(0.002)
                continue
            apply(entry["update"], float(entry["lr"]))
            step += 1
        return step

    def done(self) -> None:
        say(f"replica {self.replica} caught up: request {self.want} done")
        if self.replica_rank == 0:
            self.store.set(key_catchup_done(self.want), encode(CatchUpDone(self.want)))


def say(line: str) -> None:
    """One line in the rank's log (its stderr): where a catch-up stands, as it happens."""
    print(f"eagleeye: {line}", file=sys.stderr, flush=True)
