"""Where a restore finds each shard: local memory, peer holders, then storage.

The catalog lists what every reachable holder and the storage root hold, and reads one
shard from the fastest tier that has it, moving on when a tier fails (holder gone, segment
evicted, checksum mismatch).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ft_runtime.ckpt import _persist, _shm, _stored
from ft_runtime.ckpt._layout import BufferSource, Source, verify_crc32
from ft_runtime.ckpt._rpc import Rpc, fetch_into
from ft_runtime.ckpt.config import ClientConfig
from ft_runtime.ckpt.types import Tier
from ft_runtime.errors import CheckpointError

log = logging.getLogger(__name__)
Shard = tuple[dict[str, Any], Source, Tier]
_CHUNK = 64 << 20


class Catalog:
    """A snapshot of what every tier holds, taken once per restore."""

    def __init__(self, cfg: ClientConfig, rpcs: Mapping[str, Rpc]) -> None:
        self.cfg, self.rpcs = cfg, rpcs
        # node -> slots it holds (its own and its backups of the previous node)
        self.held: dict[str, list[dict[str, Any]]] = {}
        order = [cfg.node] + [n for n, _ in cfg.ring.nodes if n != cfg.node]
        for node in order:
            try:
                head, _ = rpcs[node].call({"op": "list"})
                self.held[node] = head["slots"]
            except CheckpointError as exc:
                log.info("holder of %s not listed: %s", node, exc)
        self._open: list[tuple[_shm.Mapping, dict[str, Any]]] = []
        self.stored: list[tuple[int, int, int]] = []
        if cfg.storage is not None:
            try:
                self.stored = _persist.catalog(cfg.storage)
            except OSError as exc:
                log.warning("storage %s not listed: %s", cfg.storage, exc)

    def candidates(self) -> list[tuple[int, int]]:
        """``(step, nshards)`` pairs some tier holds, newest first."""
        seen = {(s["step"], s["nshards"]) for slots in self.held.values() for s in slots}
        seen |= {(st, n) for st, _, n in self.stored}
        return sorted(seen, reverse=True)

    def read(self, step: int, shard: int, nshards: int, skipped: list[str]) -> Shard | None:
        """One shard from the first tier that yields it whole; reasons for failures go to
        ``skipped``."""
        for node, slots in self.held.items():
            for s in slots:
                if (s["step"], s["shard"], s["nshards"]) != (step, shard, nshards):
                    continue
                try:
                    if node == self.cfg.node:
                        return self._read_local(s)
                    return self._read_peer(node, s)
                except CheckpointError as exc:
                    skipped.append(f"step {step} shard {shard} on {node}: {exc}")
        if (step, shard, nshards) in self.stored:
            assert self.cfg.storage is not None
            try:
                # sizes are checked now, contents while they are read into the tensors
                meta, src = _stored.open_shard(self.cfg.storage, step, shard, nshards)
                return meta, src, Tier.STORAGE
            except CheckpointError as exc:
                skipped.append(f"step {step} shard {shard} in storage: {exc}")
        return None

    def _read_local(self, s: dict[str, Any]) -> Shard:
        # The segment is mapped (all pages at once) and the tensors are copied straight out
        # of it while they are assembled: one copy; finish() then checks the slot was not
        # recycled meanwhile.
        key = {k: s[k] for k in ("owner", "step", "shard", "segment")}
        head, _ = self.rpcs[self.cfg.node].call({"op": "read", **key})
        m = _shm.open_mapping(Path(head["segment"]), int(head["nbytes"]), populate=True)
        self._open.append((m, key))
        verify_crc32(m.buf, head["meta"], f"snapshot {key} in memory")
        return head["meta"], BufferSource(m.buf), Tier.MEMORY

    def finish(self) -> None:
        """Closes local segments; raises if a slot read from memory was recycled meanwhile.

        Raises:
            CheckpointError: the holder reused a segment while it was being read.
        """
        try:
            for _, key in self._open:
                self.rpcs[self.cfg.node].call({"op": "read", **key})
        finally:
            for m, _ in self._open:
                m.close()
            self._open.clear()

    def _read_peer(self, node: str, s: dict[str, Any]) -> Shard:
        buf = torch.empty(int(s["nbytes"]), dtype=torch.uint8)
        mv = _shm.as_memoryview(buf)
        meta = fetch_into(self.rpcs[node], s, mv, _CHUNK)
        verify_crc32(buf, meta, f"snapshot of step {s['step']} on {node}")
        return meta, BufferSource(buf), Tier.PEER
