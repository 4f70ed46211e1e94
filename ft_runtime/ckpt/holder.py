"""The per-node snapshot holder: owns snapshots in shared memory and outlives trainers.

It answers trainers and peer holders over a zmq ROUTER socket (JSON headers, raw byte
frames), while a background worker backs snapshots up to the next node and persists them.
When another host takes a node's place, each running holder is told the new ring (the
``ring`` request): it keeps what it holds and backs up to its new next node. Run one per
node::

    python -m ft_runtime.ckpt --job j1 --node node0 \\
        --ring node0=tcp://127.0.0.1:5600,node1=tcp://127.0.0.1:5601 --storage ckpts/
"""

from __future__ import annotations

import argparse
import dataclasses
import hmac
import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq

from ft_runtime.ckpt import _shm
from ft_runtime.ckpt._rpc import decode, encode
from ft_runtime.ckpt._table import Slot, Table
from ft_runtime.ckpt._worker import Worker
from ft_runtime.ckpt.config import (
    ENV_CKPT_TOKEN,
    ENV_MEM_CAP_GB,
    ENV_SHM_DIR,
    HolderConfig,
    Ring,
    parse_ring,
    ring_text,
    shm_dir_from,
)
from ft_runtime.ckpt.types import LOADABLE, CkptState, StateChange
from ft_runtime.errors import CheckpointError

log = logging.getLogger(__name__)

# Each request handler returns (reply header, reply frames).
Reply = tuple[dict[str, Any], list[bytes]]


class Holder:
    """One node's snapshot holder.

    Args:
        cfg: the holder's configuration.
        on_state: called with every state change of this node's own snapshots (the
            composition root records them in the run store). Remote observers use the
            ``events`` request instead (see :class:`~ft_runtime.ckpt.action.StateWatcher`).
    """

    def __init__(
        self, cfg: HolderConfig, on_state: Callable[[StateChange], None] | None = None
    ) -> None:
        self.cfg = cfg
        self.table = Table(cfg, on_state)
        self.worker = Worker(cfg, self.table)
        # a plain flag, not a threading.Event: ``stop`` runs in a signal handler, which may
        # interrupt its own earlier call (SIGTERM twice: the parent's death and a stop)
        # and must take no lock
        self._stopping = False
        self._requests: set[str] = set()
        self.request_seq = 0

    def serve_forever(self, ready: Callable[[], None] | None = None) -> None:
        """Binds, bootstraps from the neighbours in the background and serves until stop()."""
        self.table.wipe()
        ctx: zmq.Context[Any] = zmq.Context.instance()
        sock = ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        # the largest frame is a backup chunk; anything larger disconnects its sender
        sock.setsockopt(zmq.MAXMSGSIZE, self.cfg.chunk_bytes + (1 << 20))
        sock.bind(self.cfg.endpoint)
        if not _shm.huge_pages(self.cfg.shm_dir):
            log.info(
                "snapshot segments in %s use 4 KiB pages: a tmpfs mounted with "
                "huge=within_size as the shm dir (%s) makes saves and restores copy faster",
                self.cfg.shm_dir,
                ENV_SHM_DIR,
            )
        self.worker.start()
        if ready is not None:
            ready()
        try:
            while not self._stopping:
                if sock.poll(100):
                    self._serve_one(sock)
        finally:
            self.worker.stop()
            sock.close(linger=0)
            self.table.close()

    def stop(self) -> None:
        """Ends ``serve_forever`` within one poll (100 ms); safe in a signal handler."""
        self._stopping = True

    def _serve_one(self, sock: zmq.Socket[Any]) -> None:
        """Answers one request. A malformed one (frames, JSON, fields, nesting) gets an
        error reply; nothing a peer sends stops the holder."""
        ident, *rest = sock.recv_multipart()
        if len(rest) < 2 or rest[0] != b"":  # not a REQ envelope: answer as well as we can
            reply: dict[str, Any] = {"ok": False, "error": "malformed request: no envelope"}
            sock.send_multipart([ident, b"", encode(reply)], copy=False)
            return
        _, head, *frames = rest
        out: list[bytes] = []
        try:
            reply, out = self._handle(decode(head), frames)
            reply = {"ok": True, "request_seq": self.request_seq, "pid": os.getpid(), **reply}
        except Exception as exc:  # RecursionError, MemoryError of a forged size, bugs
            reply, out = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:500]}, []
        sock.send_multipart([ident, b"", encode(reply), *out], copy=False)

    def _handle(self, req: dict[str, Any], frames: list[bytes]) -> Reply:
        token = req.pop("token", "")
        if self.cfg.token and not (
            isinstance(token, str) and hmac.compare_digest(token.encode(), self.cfg.token.encode())
        ):
            raise CheckpointError("request refused: it does not carry this job's token")
        op = req.get("op")
        handler = getattr(self, f"_op_{op}", None) if isinstance(op, str) else None
        if handler is None:
            raise CheckpointError(f"unknown request {str(op)[:40]!r}")
        result: Reply = handler(req, frames)
        return result

    def _op_ping(self, req: dict[str, Any], frames: list[bytes]) -> Reply:
        return {"node": self.cfg.node, "pid": os.getpid()}, []

    def _op_alloc(self, req: dict[str, Any], frames: list[bytes]) -> Reply:
        self._check_size(req)
        slot = self.table.allocate(
            self.cfg.node,
            _count(req, "step"),
            _count(req, "shard"),
            _count(req, "nshards"),
            _count(req, "nbytes"),
        )
        return {"segment": str(slot.path), "nbytes": slot.nbytes}, []

    def _op_commit(self, req: dict[str, Any], frames: list[bytes]) -> Reply:
        """Commits a copied shard; with ``leased`` (a segment lent by the last commit) the
        slot is made now. With ``lease`` the reply lends the segment for the next save."""
        step, shard = _count(req, "step"), _count(req, "shard")
        if "leased" in req:
            self.table.allocate(
                self.cfg.node,
                step,
                shard,
                _count(req, "nshards"),
                _count(req, "nbytes"),
                leased=Path(req["leased"]),
            )
        key = (self.cfg.node, step, shard)
        slot = self.table.commit(key, req["meta"])
        self.worker.submit(key)
        if not req.get("lease"):
            return {}, []
        path = self.table.lease(self.cfg.node, shard, slot.nbytes)
        return {"lease": None if path is None else str(path)}, []

    def _op_list(self, req: dict[str, Any], frames: list[bytes]) -> Reply:
        return {
            "node": self.cfg.node,
            "slots": [s.to_json() for s in self.table.loadable(req.get("owner"))],
        }, []

    def _op_read(self, req: dict[str, Any], frames: list[bytes]) -> Reply:
        slot = self._slot(req)
        return {"segment": str(slot.path), "nbytes": slot.nbytes, "meta": slot.meta}, []

    def _op_fetch(self, req: dict[str, Any], frames: list[bytes]) -> Reply:
        slot = self._slot(req)
        off, n = _count(req, "offset"), _count(req, "length")
        m = _shm.open_mapping(slot.path, slot.nbytes)
        try:
            data = m.buf[off : off + n].numpy().tobytes()
        finally:
            m.close()
        self._slot(req)  # still the same slot after the copy: the bytes are not torn
        return {"meta": slot.meta}, [data]

    def _check_size(self, req: dict[str, Any]) -> None:
        """Refuses a shard that cannot be (bad numbers, over the cap) before any eviction."""
        if not _count(req, "shard") < _count(req, "nshards"):
            raise CheckpointError("request field 'shard' must be below 'nshards'")
        if _count(req, "nbytes") > self.cfg.mem_cap_bytes:
            raise CheckpointError(
                f"a shard of {req['nbytes']} bytes exceeds the memory cap of "
                f"{self.cfg.mem_cap_bytes} bytes"
            )

    def _check_sender(self, req: dict[str, Any]) -> None:
        """Refuses a backup that does not come from this node's previous node in the ring
        (a host replaced by a spare whose holder still runs, say)."""
        prev = self.cfg.ring.prev(self.cfg.node)
        sender = req.get("from")
        if prev is not None and sender != prev[1]:
            raise CheckpointError(
                f"backup refused: it comes from {str(sender)[:80]!r}, this node's previous "
                f"node in the ring is {prev[0]} at {prev[1]} (a replaced host?)"
            )

    def _op_backup_begin(self, req: dict[str, Any], frames: list[bytes]) -> Reply:
        self._check_sender(req)
        self._check_size(req)
        slot = self.table.allocate(
            str(req["owner"]),
            _count(req, "step"),
            _count(req, "shard"),
            _count(req, "nshards"),
            _count(req, "nbytes"),
        )
        slot.meta = req["meta"]
        return {"segment": slot.path.name}, []

    def _op_backup_chunk(self, req: dict[str, Any], frames: list[bytes]) -> Reply:
        self._check_sender(req)
        slot = self._slot(req, pending=True)
        m = _shm.open_mapping(slot.path, slot.nbytes)
        try:
            off = _count(req, "offset")
            m.buf[off : off + len(frames[0])].numpy()[:] = memoryview(frames[0])
        finally:
            m.close()
        return {}, []

    def _op_backup_end(self, req: dict[str, Any], frames: list[bytes]) -> Reply:
        self._check_sender(req)
        slot = self._slot(req, pending=True)
        self.table.commit(slot.key, slot.meta)
        return {}, []

    def _op_rebackup(self, req: dict[str, Any], frames: list[bytes]) -> Reply:
        for s in self.table.loadable(self.cfg.node):
            self.worker.submit(s.key, backup_only=True)
        return {}, []

    def _op_ring(self, req: dict[str, Any], frames: list[bytes]) -> Reply:
        """Replaces the ring (a spare host took a node's place): the same node ids in the
        same order, this node at the endpoint it is bound to; anything else is refused and
        the ring stays. From now on backups go to the new next node, and this node's
        snapshots are backed up there again; nothing held in memory is dropped."""
        text = req.get("ring")
        if not isinstance(text, str):
            raise CheckpointError("request field 'ring' must be node=endpoint pairs")
        try:
            ring = parse_ring(text)
        except ValueError as exc:
            raise CheckpointError(str(exc)) from None
        old = self.cfg.ring
        if [n for n, _ in ring.nodes] != [n for n, _ in old.nodes]:
            raise CheckpointError(
                f"ring refused: it names nodes {[n for n, _ in ring.nodes]}, this job's ring "
                f"has {[n for n, _ in old.nodes]} (only endpoints may change)"
            )
        if ring.endpoint(self.cfg.node) != self.cfg.endpoint:
            raise CheckpointError(
                f"ring refused: it names {ring.endpoint(self.cfg.node)!r} for "
                f"{self.cfg.node}, which listens at {self.cfg.endpoint!r}"
            )
        self.cfg = dataclasses.replace(self.cfg, ring=ring)
        self.worker.set_ring(ring)
        return {"ring": ring_text(ring)}, []

    def _op_events(self, req: dict[str, Any], frames: list[bytes]) -> Reply:
        evs = self.table.events_since(_count({"since": 0, **req}, "since"))
        return {"events": [e.to_json() for e in evs if e.node == self.cfg.node]}, []

    def _op_request(self, req: dict[str, Any], frames: list[bytes]) -> Reply:
        key = str(req["key"])
        duplicate = key in self._requests
        if not duplicate:
            self._requests.add(key)
            self.request_seq += 1
            self.worker.force_persist()
        return {"duplicate": duplicate, "request_seq": self.request_seq}, []

    def _op_stop(self, req: dict[str, Any], frames: list[bytes]) -> Reply:
        self.stop()
        return {}, []

    def _slot(self, req: dict[str, Any], pending: bool = False) -> Slot:
        key = (str(req.get("owner", self.cfg.node)), _count(req, "step"), _count(req, "shard"))
        slot = self.table.slots.get(key)
        ok = slot is not None and (
            slot.state == CkptState.PENDING if pending else slot.state in LOADABLE
        )
        if (
            slot is None
            or not ok
            or req.get("segment", slot.path.name) not in (slot.path.name, str(slot.path))
        ):
            raise CheckpointError(f"snapshot {key} is not held by {self.cfg.node} any more")
        return slot


def _count(req: dict[str, Any], name: str) -> int:
    """A request's integer field: a JSON integer from 0 below 2**63, else CheckpointError
    (before anything acts on the request)."""
    value = req.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        raise CheckpointError(f"request field {name!r} must be an integer >= 0: {value!r:.40}")
    return value


def _parse_ring(text: str) -> Ring:
    try:
        pairs = tuple(tuple(p.split("=", 1)) for p in text.split(","))
        return Ring(tuple((a, b) for a, b in pairs))
    except ValueError:
        raise CheckpointError(
            f"--ring {text!r}: expected node=endpoint pairs separated by commas"
        ) from None


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point of one holder process."""
    ap = argparse.ArgumentParser(prog="python -m ft_runtime.ckpt")
    ap.add_argument("--job", required=True)
    ap.add_argument("--node", required=True)
    ap.add_argument("--ring", required=True, help="node0=tcp://127.0.0.1:5600,node1=...")
    ap.add_argument("--storage", default=None)
    ap.add_argument("--persist-every", type=int, default=1)
    ap.add_argument("--keep-last", type=int, default=2)
    ap.add_argument("--keep-in-memory", type=int, default=2)
    ap.add_argument("--mem-cap-gb", type=float, default=float(os.environ.get(ENV_MEM_CAP_GB, 16)))
    ap.add_argument("--shm-dir", default=shm_dir_from(os.environ))
    a = ap.parse_args(argv)
    cfg = HolderConfig(
        a.job,
        a.node,
        _parse_ring(a.ring),
        a.storage,
        a.persist_every,
        a.keep_last,
        a.keep_in_memory,
        int(a.mem_cap_gb * (1 << 30)),
        a.shm_dir,
    )
    cfg = dataclasses.replace(cfg, token=os.environ.get(ENV_CKPT_TOKEN, ""))
    holder = Holder(cfg)
    signal.signal(signal.SIGTERM, lambda *_: holder.stop())
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    holder.serve_forever(ready=lambda: print(f"ready {cfg.node} {cfg.endpoint}", flush=True))
    return 0
