"""The holder's table of snapshot segments: states, eviction, recycling and the event log.

Thread-safe: the holder's request loop and its background worker both use it. Segments of
evicted iterations are recycled for the next save of the same size, so a trainer copies into
pages that are already allocated and mapped. After each commit a trainer's shard is lent the
segment for its next save (a lease), so that save copies at once and needs one request (the
commit) instead of two: a lease is no snapshot, and a trainer killed while copying into one
leaves nothing loadable behind.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ft_runtime.ckpt import _shm
from ft_runtime.ckpt.config import HolderConfig
from ft_runtime.ckpt.types import LOADABLE, CkptState, StateChange
from ft_runtime.errors import CheckpointError

Key = tuple[str, int, int]  # (owner node, step, shard)


@dataclass
class Slot:
    """One shard of one step in this holder's memory (its own, or a backup of ``owner``)."""

    owner: str
    step: int
    shard: int
    nshards: int
    nbytes: int
    path: Path
    state: CkptState = CkptState.PENDING
    meta: dict[str, Any] = field(default_factory=dict)
    pins: int = 0
    persisted: bool = False

    @property
    def key(self) -> Key:
        return (self.owner, self.step, self.shard)

    def to_json(self) -> dict[str, Any]:
        return {
            "owner": self.owner,
            "step": self.step,
            "shard": self.shard,
            "nshards": self.nshards,
            "nbytes": self.nbytes,
            "state": self.state.value,
            "segment": self.path.name,
        }


class Table:
    """Slots by key, a pool of free segments, and the state-change log."""

    def __init__(
        self, cfg: HolderConfig, on_state: Callable[[StateChange], None] | None = None
    ) -> None:
        self.cfg, self.on_state = cfg, on_state
        self.lock = threading.RLock()
        self.slots: dict[Key, Slot] = {}
        self._pool: list[tuple[Path, int]] = []
        self._leases: dict[tuple[str, int], tuple[Path, int]] = {}  # (owner, shard) -> segment
        self._events: deque[StateChange] = deque(maxlen=10_000)
        self._seq = 0
        self._counter = 0
        self.dir = Path(cfg.shm_dir)
        self.prefix = f"eeckpt.{cfg.job}.{cfg.node}."

    def wipe(self) -> None:
        """Deletes segments a previous holder of this node left (their index is lost)."""
        for p in self.dir.glob(self.prefix + "*"):
            p.unlink(missing_ok=True)

    def used_bytes(self) -> int:
        held = [*self._pool, *self._leases.values()]
        return sum(s.nbytes for s in self.slots.values()) + sum(n for _, n in held)

    def set_state(self, slot: Slot, state: CkptState, error: str = "") -> None:
        """Records a transition (or an error on the current state) and tells the callback."""
        with self.lock:
            slot.state = state
            self._seq += 1
            ev = StateChange(
                slot.owner, slot.step, slot.shard, state, time.time(), error, self._seq
            )
            self._events.append(ev)
        if self.on_state is not None and slot.owner == self.cfg.node:
            try:
                self.on_state(ev)
            except Exception:  # a broken callback must not stop the holder
                pass

    def events_since(self, seq: int) -> list[StateChange]:
        with self.lock:
            return [e for e in self._events if e.seq > seq]

    def allocate(
        self,
        owner: str,
        step: int,
        shard: int,
        nshards: int,
        nbytes: int,
        leased: Path | None = None,
    ) -> Slot:
        """A PENDING slot for a new snapshot shard, evicting what it must to fit the cap.

        With ``leased``, the slot takes the segment lent to ``(owner, shard)`` by
        :meth:`lease`, which the trainer has already filled; otherwise a lease still held
        for the shard (its trainer restarted) goes back to the pool.

        Raises:
            CheckpointError: ``leased`` is not the segment lent to this shard for ``nbytes``.
        """
        with self.lock:
            if leased is None:
                self._return_lease((owner, shard))
            elif self._leases.get((owner, shard)) != (leased, nbytes):
                raise CheckpointError(
                    f"segment {leased.name} is not lent to {owner} shard {shard} for {nbytes} "
                    "bytes (the holder restarted?): save again without a lease"
                )
            else:
                del self._leases[(owner, shard)]
            for s in list(self.slots.values()):
                if s.owner == owner and s.shard == shard and s.state == CkptState.PENDING:
                    self.set_state(s, CkptState.BROKEN, "superseded before it was committed")
                    self._release(s)
            old = self.slots.get((owner, step, shard))
            if old is not None:
                self._evict(old, "replaced by a new save of the same step")
            # keep at least one complete snapshot while this one is written: a trainer
            # killed mid-copy must find the previous step intact
            self._evict_window(owner, shard, keep=max(1, self.cfg.keep_in_memory - 1))
            path = leased if leased is not None else self._segment(nbytes)
            slot = Slot(owner, step, shard, nshards, nbytes, path)
            self.slots[slot.key] = slot
            self.set_state(slot, CkptState.PENDING)
            return slot

    def lease(self, owner: str, shard: int, nbytes: int) -> Path | None:
        """Lends ``(owner, shard)`` a segment of ``nbytes`` for its next save.

        A lease never evicts a snapshot: None when it fits neither the pool nor the room
        left under the memory cap (the next save then allocates, evicting as it must).
        """
        with self.lock:
            lent = self._leases.get((owner, shard))
            if lent is not None and lent[1] == nbytes:
                return lent[0]
            self._return_lease((owner, shard))
            path = self._pooled(nbytes)
            if path is None and self.used_bytes() + nbytes <= self.cfg.mem_cap_bytes:
                try:
                    path = self._create(nbytes)
                except CheckpointError:
                    return None  # the tmpfs is full: the next save reports it
            if path is not None:
                self._leases[(owner, shard)] = (path, nbytes)
            return path

    def commit(self, key: Key, meta: dict[str, Any]) -> Slot:
        with self.lock:
            slot = self.slots.get(key)
            if slot is None or slot.state != CkptState.PENDING:
                raise CheckpointError(f"no pending snapshot {key}: allocate before committing")
            slot.meta = meta
            self.set_state(slot, CkptState.CACHED)
            self._evict_window(slot.owner, slot.shard, keep=self.cfg.keep_in_memory)
            return slot

    def loadable(self, owner: str | None = None) -> list[Slot]:
        with self.lock:
            return [
                s
                for s in self.slots.values()
                if s.state in LOADABLE and (owner is None or s.owner == owner)
            ]

    def unpin(self, slot: Slot) -> None:
        with self.lock:
            slot.pins -= 1
            if slot.state in (CkptState.OBSOLESCENT, CkptState.BROKEN):
                self._release(slot)

    def drop(self, owner: str, step: int | None = None, reason: str = "dropped") -> None:
        """Evicts ``owner``'s slots (of ``step``, or all)."""
        with self.lock:
            for s in list(self.slots.values()):
                if s.owner == owner and (step is None or s.step == step):
                    self._evict(s, reason)
            if step is None:
                for key in [k for k in self._leases if k[0] == owner]:
                    self._return_lease(key)

    def _return_lease(self, key: tuple[str, int]) -> None:
        """Puts the segment lent to ``(owner, shard)``, if any, back in the pool."""
        lent = self._leases.pop(key, None)
        if lent is not None:
            self._pool.append(lent)

    def _evict_window(self, owner: str, shard: int, keep: int) -> None:
        done = sorted(
            (
                s
                for s in self.slots.values()
                if s.owner == owner and s.shard == shard and s.state in LOADABLE
            ),
            key=lambda s: s.step,
        )
        for s in done[: max(0, len(done) - keep)]:
            self._evict(s, "evicted: older than the in-memory window")

    def _evict(self, slot: Slot, reason: str) -> None:
        if slot.state not in (CkptState.OBSOLESCENT, CkptState.BROKEN):
            self.set_state(slot, CkptState.OBSOLESCENT, reason)
        self._release(slot)

    def _release(self, slot: Slot) -> None:
        # A pinned slot (being backed up or persisted) keeps its segment until unpinned.
        if slot.pins > 0 or self.slots.get(slot.key) is not slot:
            return
        del self.slots[slot.key]
        self._pool.append((slot.path, slot.nbytes))

    def _segment(self, nbytes: int) -> Path:
        pooled = self._pooled(nbytes)
        if pooled is not None:
            return pooled
        if self.used_bytes() + nbytes > self.cfg.mem_cap_bytes:
            self._make_room(nbytes)
        return self._create(nbytes)

    def _pooled(self, nbytes: int) -> Path | None:
        for i, (p, n) in enumerate(self._pool):
            if n == nbytes:
                del self._pool[i]
                return p
        return None

    def _create(self, nbytes: int) -> Path:
        self._counter += 1
        path = self.dir / f"{self.prefix}{time.time_ns()}.{self._counter}"
        _shm.create(path, nbytes)
        return path

    def _make_room(self, nbytes: int) -> None:
        """Frees pooled segments, then the oldest iterations, until ``nbytes`` fit the cap.

        The newest complete iteration of every shard is never evicted, and nothing is
        evicted at all when even that would not make the new snapshot fit.
        """
        newest: dict[tuple[str, int], int] = {}
        for s in self.slots.values():
            if s.state in LOADABLE:
                k = (s.owner, s.shard)
                newest[k] = max(newest.get(k, s.step), s.step)
        victims = sorted(
            (
                s
                for s in self.slots.values()
                if s.state in LOADABLE and s.pins == 0 and s.step != newest[(s.owner, s.shard)]
            ),
            key=lambda s: (s.owner == self.cfg.node, s.step),  # backups of others go first
        )
        free = sum(n for _, n in self._pool) + sum(s.nbytes for s in victims)
        if self.used_bytes() - free + nbytes > self.cfg.mem_cap_bytes:
            raise CheckpointError(
                f"memory cap of {self.cfg.mem_cap_bytes} bytes reached on {self.cfg.node}: "
                f"a {nbytes}-byte snapshot does not fit next to the newest snapshots; "
                "raise mem_cap_bytes"
            )
        while self._pool and self.used_bytes() + nbytes > self.cfg.mem_cap_bytes:
            p, _ = self._pool.pop(0)
            p.unlink(missing_ok=True)
        for s in victims:
            if self.used_bytes() + nbytes <= self.cfg.mem_cap_bytes:
                break
            self._evict(s, "evicted: memory cap")
            if self._pool and self._pool[-1][0] == s.path:
                self._pool.pop()[0].unlink(missing_ok=True)

    def close(self) -> None:
        with self.lock:
            for s in self.slots.values():
                s.path.unlink(missing_ok=True)
            for p, _ in [*self._pool, *self._leases.values()]:
                p.unlink(missing_ok=True)
            self.slots.clear()
            self._pool.clear()
            self._leases.clear()
