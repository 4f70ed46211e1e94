"""The trainer's side of the engine: ``save(state, step)`` and ``load()``.

A save copies this rank's 1/D shard of every tensor into a segment of the local holder (the
only part that blocks, or none of it with ``wait=False``) and commits; the segment is the
one the holder lent at the last commit, so only a rank's first save asks for one first.
Backup and persistence then run inside the holder. A load takes the newest step whose every shard
can be read, trying local memory, then peer holders, then storage, and falls back to older
steps when a candidate is incomplete or corrupt.

Example::

    client = CheckpointClient(ClientConfig("node0", ring))
    client.save({"model": model.state_dict(), "step": 7}, step=7)
    restored = client.load()  # LoadResult(state, step, tiers) or None
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import zmq

from ft_runtime.ckpt import _layout, _shm, _stored, _tree
from ft_runtime.ckpt._rpc import HolderUnavailable, Rpc
from ft_runtime.ckpt._sources import Catalog
from ft_runtime.ckpt.config import ClientConfig
from ft_runtime.ckpt.types import LoadResult, SaveResult
from ft_runtime.errors import CheckpointError, CheckpointsUnusable

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Plan:
    """A state's layout in a segment, kept while names, dtypes and shapes stay the same, so
    a save does no per-tensor planning or JSON work."""

    signature: tuple[Any, ...]
    entries: list[_layout.Entry]
    entries_json: list[list[Any]]
    nbytes: int
    nshards: int


@dataclass(frozen=True, slots=True)
class _Save:
    """One save in flight: what to copy, where it goes, and when the call began."""

    plan: _Plan
    tensors: list[tuple[str, torch.Tensor]]
    step: int
    meta: dict[str, Any]
    t0: float


_PROBE_S = 0.5  # how long a probe of a holder taken for gone may wait
_DOWN_S = 1.0  # how long saves fail at once before the holder is probed again


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class CheckpointClient:
    """One rank's checkpoint client. Not thread-safe; one per training process.

    Args:
        cfg: where this rank runs and which shard it snapshots.
        copy_hook: test seam called with the index of each tensor after it is copied.
    """

    def __init__(self, cfg: ClientConfig, copy_hook: Callable[[int], None] | None = None) -> None:
        self.cfg = cfg
        self._ctx: zmq.Context[Any] = zmq.Context.instance()
        t = cfg.timeout.total_seconds()
        self._rpcs = {n: Rpc(self._ctx, ep, t, cfg.token) for n, ep in cfg.ring.nodes}
        self._poll = Rpc(self._ctx, cfg.ring.endpoint(cfg.node), t, cfg.token)
        self._probe = Rpc(self._ctx, cfg.ring.endpoint(cfg.node), min(t, _PROBE_S), cfg.token)
        self._holder_pid = 0  # the local holder's, from its replies
        self._down_until = 0.0  # saves fail at once until then: the local holder is gone
        self._maps: dict[str, _shm.Mapping] = {}
        self._layout: _Plan | None = None
        self._views: dict[str, list[torch.Tensor]] = {}  # segment -> its entries' views
        # segment -> (the tensors' addresses, the byte copies that save them there)
        self._copies: dict[str, tuple[Any, list[_layout.ByteCopy] | None]] = {}
        self._lease: tuple[str, int] | None = None  # (segment, nbytes) lent for the next save
        self._pending: threading.Thread | None = None
        self._last: SaveResult | None = None
        self._honoured = 0
        self._copy_hook = copy_hook
        self._stream = torch.cuda.Stream() if torch.cuda.is_available() else None  # type: ignore[no-untyped-call]

    @property
    def _local(self) -> Rpc:
        return self._rpcs[self.cfg.node]

    def save(self, state: Any, step: int, *, wait: bool = True) -> SaveResult:
        """Snapshots ``state`` (tensors and plain data) as ``step``.

        With ``wait=False`` the allocation and the copy run in a background thread and this
        returns at once (its result comes from :meth:`fence`);
        the caller must not change the state until :meth:`fence` returns (see
        :meth:`install_fence`). A holder that is gone or full gives ``ok=False``, never an
        exception; a state holding something other than tensors and plain data raises.

        Raises:
            CheckpointError: ``state`` holds an object that cannot be stored safely.
        """
        self.fence()
        t0 = time.perf_counter()
        tree, tensors = _tree.flatten(state)
        plan = self._plan(tensors)
        meta = {"entries": plan.entries_json, "tree": tree, "step": step, "nshards": plan.nshards}
        job = _Save(plan, tensors, step, meta, t0)
        if wait:
            self._snapshot(job)
            assert self._last is not None
            return self._last
        # Even the allocation request runs in the background: on a busy host, waking the
        # holder costs milliseconds the training step should not wait for.
        self._pending = threading.Thread(target=self._snapshot, args=(job,), daemon=True)
        self._pending.start()
        return SaveResult(step, True, time.perf_counter() - t0, plan.nbytes)

    def fence(self) -> SaveResult | None:
        """Waits for a background save to finish copying; returns its result."""
        if self._pending is not None:
            self._pending.join()
            self._pending = None
        return self._last

    def install_fence(self, optimizer: torch.optim.Optimizer) -> None:
        """Makes ``optimizer.step()`` wait for a background copy before it changes weights."""

        def hook(*_: Any) -> None:
            self.fence()

        optimizer.register_step_pre_hook(hook)

    def save_requested(self) -> bool:
        """True when a checkpoint action asked for a save this rank has not made yet."""
        try:
            head, _ = self._poll.call({"op": "ping"})
        except CheckpointError:
            return False
        return int(head.get("request_seq", 0)) > self._honoured

    def _snapshot(self, job: _Save) -> None:
        if threading.current_thread() is self._pending:
            # hand the GIL straight back: otherwise save() waits a whole switch interval
            # (5 ms) for it while this thread runs Python
            time.sleep(0)
        down = self._holder_down()
        if down:
            self._last = self._failed(job.step, job.t0, HolderUnavailable(down))
            return
        try:
            self._last = self._copy_and_commit(job)
        except HolderUnavailable as exc:
            self._mark_down()
            self._last = self._failed(job.step, job.t0, exc)
        except CheckpointError as exc:
            self._last = self._failed(job.step, job.t0, exc)

    def _holder_down(self) -> str:
        """Why the local holder is taken for gone ("" when it is not): its process has
        exited, or it did not answer lately and does not answer a short probe now. Saves
        then fail at once instead of each waiting for the timeout."""
        if time.monotonic() < self._down_until:
            return f"the holder of {self.cfg.node} is gone; saves fail until it is back"
        if self._down_until or (self._holder_pid and not _alive(self._holder_pid)):
            try:
                head, _ = self._probe.call({"op": "ping"})
                self._holder_pid, self._down_until = int(head.get("pid", 0)), 0.0
            except CheckpointError:
                self._mark_down()
                return f"the holder of {self.cfg.node} does not answer"
        return ""

    def _mark_down(self) -> None:
        self._down_until = time.monotonic() + _DOWN_S
        self._lease = None  # a restarted holder lends segments anew

    def _copy_and_commit(self, job: _Save) -> SaveResult:
        """Copies into the segment the holder lent at the last commit (or allocates one)
        and commits; a lease the holder no longer knows (it restarted) costs one retry."""
        plan, step = job.plan, job.step
        lease, self._lease = self._lease, None
        if lease is not None and lease[1] != plan.nbytes:
            lease = None
        commit: dict[str, Any] = {"op": "commit", "step": step, "shard": self.cfg.dp_rank}
        if lease is None:
            head, _ = self._local.call({**commit, "op": "alloc", **self._sizes(plan)})
            segment = head["segment"]
        else:
            segment = lease[0]
            commit |= {"leased": segment, **self._sizes(plan)}
        try:
            self._copy(plan, job.tensors, segment)
            meta = {**job.meta, "crc32": _layout.crc32(self._map(segment, plan.nbytes).buf)}
            head, _ = self._local.call({**commit, "meta": meta, "lease": True})
        except HolderUnavailable:
            raise
        except CheckpointError:  # the lease's segment is gone, or the holder forgot it
            if lease is None:
                raise
            return self._copy_and_commit(job)
        if head.get("lease"):
            self._lease = (str(head["lease"]), plan.nbytes)
        self._holder_pid = int(head.get("pid", 0))
        self._honoured = max(self._honoured, int(head.get("request_seq", 0)))
        return SaveResult(step, True, time.perf_counter() - job.t0, plan.nbytes)

    def _sizes(self, plan: _Plan) -> dict[str, int]:
        return {"nshards": self.cfg.dp_size, "nbytes": plan.nbytes}

    def _copy(self, plan: _Plan, tensors: list[tuple[str, torch.Tensor]], segment: str) -> None:
        """Copies this rank's shard of ``tensors`` into ``segment``: CPU tensors by a plan of
        byte copies kept while the same tensors are saved; CUDA ones on the side stream."""
        buf = self._map(segment, plan.nbytes).buf
        views = self._views.get(segment)
        if views is None:
            views = self._views[segment] = [_layout.view(buf, e) for e in plan.entries]
        if self._copy_hook is None:
            key = _layout.addresses(tensors)
            cached = self._copies.get(segment)
            if cached is None or cached[0] != key:
                copies = _layout.host_copies(views, plan.entries, tensors, self.cfg.dp_rank)
                cached = self._copies[segment] = (key, copies)
            if cached[1] is not None:
                _layout.run_copies(cached[1])
                return

        def copy() -> None:
            _layout.copy_in(
                buf, plan.entries, tensors, self.cfg.dp_rank, self._copy_hook, views=views
            )

        if self._stream is not None:
            self._stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self._stream):
                copy()
            self._stream.synchronize()
        else:
            copy()

    def _failed(self, step: int, t0: float, exc: Exception) -> SaveResult:
        log.warning("checkpoint save of step %d failed: %s", step, exc)
        self._last = SaveResult(step, False, time.perf_counter() - t0, 0, str(exc))
        return self._last

    def _plan(self, tensors: list[tuple[str, torch.Tensor]]) -> _Plan:
        sig = _layout.signature(tensors)
        if self._layout is None or self._layout.signature != sig:
            entries, n = _layout.plan(tensors, self.cfg.dp_size)
            self._layout = _Plan(sig, entries, [e.to_json() for e in entries], n, self.cfg.dp_size)
            self._views.clear()
            self._copies.clear()
        return self._layout

    def _map(self, segment: str, nbytes: int) -> _shm.Mapping:
        m = self._maps.get(segment)
        if m is None or m.size != nbytes:
            for name in [n for n in self._maps if n == segment or not Path(n).exists()]:
                # the holder deleted (or resized) it: an unlinked file's pages stay
                # allocated for as long as we keep them mapped
                self._views.pop(name, None)
                self._copies.pop(name, None)
                self._maps.pop(name).close()
            m = _shm.open_mapping(Path(segment), nbytes)
            self._maps[segment] = m
            if self._stream is not None and nbytes:
                # pinned (page-locked) host memory lets device-to-host copies run async
                torch.cuda.cudart().cudaHostRegister(  # type: ignore[no-untyped-call]
                    m.buf.data_ptr(), nbytes, 0
                )
        return m

    def load(self, into: Any = None, at_most: int | None = None) -> LoadResult | None:
        """Restores the newest step whose every shard can be read and verified.

        Args:
            into: optionally, a state of the same structure (e.g. the freshly built model's
                and optimizer's state dicts): its CPU tensors with matching name, dtype and
                shape are filled in place and returned, which saves allocating them again.
            at_most: only steps up to this one (a rollback); None: the newest of all.

        Returns None when no checkpoint exists anywhere; raises CheckpointsUnusable when
        some exist but none can be loaded (corrupt, or of another shape or dtype than
        ``into``). Never unpickles: tensors come from
        raw bytes (storage: at the offsets the manifest records, checksums verified while
        reading), plain data from JSON. The tensors of ``into`` are written while a step is
        read: when every step fails, they may hold partial content.
        """
        self.fence()
        template = dict(_tree.flatten(into)[1]) if into is not None else None
        cat = Catalog(self.cfg, self._rpcs)
        skipped: list[str] = []
        for step, nshards in cat.candidates():
            if at_most is not None and step > at_most:
                continue
            got = [cat.read(step, i, nshards, skipped) for i in range(nshards)]
            if any(g is None for g in got):
                skipped.append(f"step {step}: a shard could not be read from any tier")
                try:
                    cat.finish()
                except CheckpointError:
                    pass  # the step is skipped anyway
                continue
            shards = [g for g in got if g is not None]
            meta = shards[0][0]
            try:
                entries = _stored.entries_of(meta, f"step {step}")
                tensors = _layout.assemble(entries, [src for _, src, _ in shards], template)
                state = _tree.unflatten(meta["tree"], tensors)
                cat.finish()
            except CheckpointError as exc:
                skipped.append(f"step {step}: {exc}")
                try:
                    cat.finish()  # unmap this step's segments before trying an older one
                except CheckpointError:
                    pass
                continue
            return LoadResult(
                state,
                step,
                tuple(t for _, _, t in shards),
                tuple(skipped),
            )
        if skipped:
            log.warning("no loadable checkpoint: %s", "; ".join(skipped))
            raise CheckpointsUnusable(
                f"checkpoints exist but none could be loaded: {'; '.join(skipped)[:500]}"
            )
        return None

    def close(self) -> None:
        self.fence()
        for r in [*self._rpcs.values(), self._poll, self._probe]:
            r.close()
        self._views.clear()
        self._copies.clear()
        for m in self._maps.values():
            m.close()
        self._maps.clear()
