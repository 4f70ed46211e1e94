"""The holder's background worker: ring backup, persistence and bootstrap from peers.

Each committed snapshot is reconciled one transition at a time, as in TRANSOM's engine:
CACHED -> backed up to the next node -> BACKED_UP -> persisted -> PERSISTENT. A failed step
leaves the snapshot where it was (in memory, loadable) and records the error as an event.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
from typing import Any

import zmq

from ft_runtime.ckpt import _persist, _shm
from ft_runtime.ckpt._rpc import Rpc, fetch_into
from ft_runtime.ckpt._table import Key, Slot, Table
from ft_runtime.ckpt.config import HolderConfig, Ring
from ft_runtime.ckpt.types import CkptState
from ft_runtime.errors import CheckpointError

log = logging.getLogger(__name__)
_PEER_TIMEOUT_S = 10.0
_RING = ("", -1, -1), True  # the queue's marker of a new ring (set_ring)


class Worker:
    """Runs backups and persistence off the request loop, in one thread."""

    def __init__(self, cfg: HolderConfig, table: Table) -> None:
        self.cfg, self.table = cfg, table
        self._q: queue.Queue[tuple[Key, bool] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="ckpt-worker", daemon=True)
        self._force = threading.Event()
        self._next: Rpc | None = None
        self._ring_lock = threading.Lock()
        self._new_ring: Ring | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._q.put(None)
        # bounded: a backup to a peer that is gone waits for its timeout; the process exits
        # anyway, and a persist cut short leaves only a temporary name, never a checkpoint
        self._thread.join(timeout=2)

    def submit(self, key: Key, backup_only: bool = False) -> None:
        self._q.put((key, backup_only))

    def set_ring(self, ring: Ring) -> None:
        """Backups go to ``ring``'s next node from the next item on (taken in the worker's
        thread, which owns the connection); this node's snapshots are backed up there."""
        with self._ring_lock:
            self._new_ring = ring
        self._q.put(_RING)

    def force_persist(self) -> None:
        """The next reconciled snapshot is persisted whatever ``persist_every`` says."""
        self._force.set()

    def _run(self) -> None:
        ctx: zmq.Context[Any] = zmq.Context.instance()
        nxt = self.cfg.ring.next(self.cfg.node)
        if nxt is not None:
            self._next = Rpc(ctx, nxt[1], _PEER_TIMEOUT_S, self.cfg.token)
        self._bootstrap(ctx)
        while (item := self._q.get()) is not None:
            self._take_ring(ctx)
            if item is _RING:
                continue
            key, backup_only = item
            slot = self._pin(key)
            if slot is None:
                continue
            try:
                self._reconcile(slot, backup_only)
            finally:
                self.table.unpin(slot)
        if self._next is not None:
            self._next.close()

    def _take_ring(self, ctx: zmq.Context[Any]) -> None:
        with self._ring_lock:
            ring, self._new_ring = self._new_ring, None
        if ring is None:
            return
        old, old_prev = self.cfg.ring.next(self.cfg.node), self.cfg.ring.prev(self.cfg.node)
        self.cfg = dataclasses.replace(self.cfg, ring=ring)
        prev = ring.prev(self.cfg.node)
        if prev is not None and prev != old_prev:  # a new previous node backs up here again
            self._ask_rebackup(ctx, prev[1], "new previous node")
        nxt = ring.next(self.cfg.node)
        if nxt == old:
            return
        if self._next is not None:
            self._next.close()
        self._next = None if nxt is None else Rpc(ctx, nxt[1], _PEER_TIMEOUT_S, self.cfg.token)
        log.info("backing up to %s at %s from now on", *(nxt or ("no node", "-")))
        for slot in self.table.loadable(self.cfg.node):
            self.submit(slot.key, backup_only=True)

    def _pin(self, key: Key) -> Slot | None:
        with self.table.lock:
            slot = self.table.slots.get(key)
            if slot is None or slot.state not in (
                CkptState.CACHED,
                CkptState.BACKED_UP,
                CkptState.PERSISTENT,
            ):
                return None
            slot.pins += 1
            return slot

    def _reconcile(self, slot: Slot, backup_only: bool) -> None:
        if self._next is not None:
            try:
                self._backup(slot)
                if slot.state == CkptState.CACHED:
                    self.table.set_state(slot, CkptState.BACKED_UP)
            except CheckpointError as exc:
                self.table.set_state(slot, slot.state, f"backup failed: {exc}")
        if backup_only or self.cfg.storage is None or slot.persisted:
            return
        if slot.step % self.cfg.persist_every and not self._force.is_set():
            return
        self._force.clear()
        try:
            self._persist(slot)
        except Exception as exc:  # any failure here must leave the memory tier serving
            msg = (
                f"persisting step {slot.step} shard {slot.shard} to {self.cfg.storage} "
                f"failed: {exc}; the snapshot stays in memory, free space or change storage"
            )
            log.error(msg)
            self.table.set_state(slot, slot.state, msg)

    def _backup(self, slot: Slot) -> None:
        assert self._next is not None
        # "from": the receiver takes backups only from its previous node in its ring
        base = {
            "owner": slot.owner,
            "step": slot.step,
            "shard": slot.shard,
            "from": self.cfg.endpoint,
        }
        self._next.call(
            {
                "op": "backup_begin",
                **base,
                "nshards": slot.nshards,
                "nbytes": slot.nbytes,
                "meta": slot.meta,
            }
        )
        m = _shm.open_mapping(slot.path, slot.nbytes)
        try:
            for off in range(0, slot.nbytes, self.cfg.chunk_bytes):
                chunk = m.buf[off : off + self.cfg.chunk_bytes]
                self._next.call(
                    {"op": "backup_chunk", **base, "offset": off}, [_shm.as_memoryview(chunk)]
                )
        finally:
            m.close()
        self._next.call({"op": "backup_end", **base})

    def _persist(self, slot: Slot) -> None:
        assert self.cfg.storage is not None
        m = _shm.open_mapping(slot.path, slot.nbytes)
        try:
            _persist.persist(
                self.cfg.storage,
                m.buf,
                slot.meta,
                slot.step,
                slot.shard,
                slot.nshards,
                self.cfg.keep_last,
            )
        finally:
            m.close()
        slot.persisted = True
        self.table.set_state(slot, CkptState.PERSISTENT)

    def _bootstrap(self, ctx: zmq.Context[Any]) -> None:
        """A (re)started holder pulls its own snapshots back from the next node's backups
        and asks the previous node to back up to it again."""
        if self._next is not None:
            try:
                self._pull_backups(self._next)
            except CheckpointError as exc:
                log.info("no backups pulled from the next node: %s", exc)
        prev = self.cfg.ring.prev(self.cfg.node)
        if prev is not None:
            self._ask_rebackup(ctx, prev[1], "previous node")

    def _ask_rebackup(self, ctx: zmq.Context[Any], endpoint: str, who: str) -> None:
        """Asks the holder at ``endpoint`` to back its snapshots up to this one again."""
        rpc = Rpc(ctx, endpoint, 2.0, self.cfg.token)
        try:
            rpc.call({"op": "rebackup"})
        except CheckpointError as exc:
            log.info("%s not asked to back up again: %s", who, exc)
        finally:
            rpc.close()

    def _pull_backups(self, rpc: Rpc) -> None:
        head, _ = rpc.call({"op": "list", "owner": self.cfg.node})
        for s in sorted(head["slots"], key=lambda s: s["step"]):
            slot = self.table.allocate(
                self.cfg.node, s["step"], s["shard"], s["nshards"], s["nbytes"]
            )
            m = _shm.open_mapping(slot.path, slot.nbytes)
            try:
                mv = _shm.as_memoryview(m.buf)
                slot.meta = fetch_into(rpc, s, mv, self.cfg.chunk_bytes)
                del mv
            finally:
                m.close()
            with self.table.lock:
                self.table.set_state(slot, CkptState.BACKED_UP, "restored from the next node")
