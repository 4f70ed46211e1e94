"""Reading a persisted shard straight into its destination tensors, verifying as it reads.

The manifest (JSON) says where each tensor's raw bytes lie in the DCP files and gives each
file's block checksums. A restore asks for each tensor's bytes (:meth:`StoredSource.add`)
and then runs one task per file block: the task reads the block in pieces of a few MiB,
each piece straight into the tensor it belongs to (zip headers and padding into a scratch
buffer), hashes the piece while it is still in cache, and compares the block's digest
with the manifest. Every byte of every file is read once and hashed once; blocks are
verified in parallel threads (file reads and hashlib release the GIL). Neither DCP's
pickled ``.metadata`` nor the pickles inside the ``.distcp`` items are ever loaded.

A mismatch raises :class:`CorruptCheckpoint` after the bytes went to their destinations:
a failed restore leaves the destination tensors with partial content, and the caller
falls back to an older checkpoint.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO

import fsspec  # type: ignore[import-untyped]
import numpy as np
import torch

from ft_runtime.ckpt import _layout, _torchzip
from ft_runtime.ckpt._layout import Entry, Task, run_tasks
from ft_runtime.ckpt._manifest import (
    FORMATS,
    MANIFEST,
    PIECE_BYTES,
    Checksum,
    CorruptCheckpoint,
)

Opener = Callable[[str], BinaryIO]
# (file offset, length, destination bytes or None for bytes that only get hashed)
Segment = tuple[int, int, "np.ndarray[Any, Any] | None"]


@dataclass(frozen=True, slots=True)
class StoredFile:
    """One file of a persisted shard, as its manifest describes it."""

    path: str
    nbytes: int
    checksum: Checksum


def shard_dir(step: int, shard: int, nshards: int) -> str:
    return f"step_{step:010d}/shard_{shard}-of-{nshards}"


def is_local(root: str) -> bool:
    return "://" not in root or root.startswith("file://")


def _open_local(path: str) -> BinaryIO:
    return open(path, "rb", buffering=0)  # reads go straight into the caller's buffer


class StoredSource:
    """A persisted shard as a restore source: reads verified bytes into destinations."""

    io_bound = True

    def __init__(
        self,
        where: str,
        files: dict[str, StoredFile],
        data: dict[str, tuple[str, int, int]],
        opener: Opener,
    ) -> None:
        self.where, self.files, self.data, self._open = where, files, data, opener
        self._targets: dict[str, list[tuple[int, np.ndarray[Any, Any]]]] = {}

    def add(self, e: Entry, dst: np.ndarray[Any, Any]) -> None:
        """Asks for the first ``len(dst)`` bytes of ``e``'s shard to land in ``dst``.

        Raises:
            CorruptCheckpoint: the manifest does not hold the tensor where it should.
        """
        try:
            rel, off, length = self.data[e.name]
            f = self.files[rel]
        except KeyError:
            raise CorruptCheckpoint(f"{self.where}: the manifest has no tensor {e.name}") from None
        if length != e.nbytes or off < 0 or off + length > f.nbytes:
            raise CorruptCheckpoint(
                f"{self.where}: tensor {e.name} is {length} bytes at {off} of {rel} "
                f"({f.nbytes} bytes); its entry needs {e.nbytes}"
            )
        if len(dst):
            self._targets.setdefault(rel, []).append((off, dst))

    def tasks(self) -> list[Task]:
        """One task per block of every file: read, scatter, hash and verify."""
        out: list[Task] = []
        for rel, f in self.files.items():
            segments = _cover(sorted(self._targets.get(rel, []), key=lambda t: t[0]), f)
            for i, segs in enumerate(_split(segments, f)):
                out.append(functools.partial(self._read_block, f, i, segs))
        self._targets.clear()
        return out

    def _read_block(self, f: StoredFile, i: int, segs: list[Segment]) -> None:
        start, end = f.checksum.block(i, f.nbytes)
        h = hashlib.new(f.checksum.algorithm)
        gap = max((n for _, n, d in segs if d is None), default=0)
        scratch = memoryview(bytearray(min(PIECE_BYTES, gap))) if gap else None
        with self._open(f.path) as fh:
            fh.seek(start)
            for _, length, dst in segs:
                for j in range(0, length, PIECE_BYTES):
                    k = min(PIECE_BYTES, length - j)
                    if dst is None:
                        assert scratch is not None
                        mv = scratch[:k]
                    else:
                        mv = dst[j : j + k].data
                    _read_exact(fh, mv, f.path)
                    h.update(mv)
        if h.hexdigest() != f.checksum.digests[i]:
            raise CorruptCheckpoint(
                f"{f.path}: {f.checksum.algorithm} mismatch in bytes {start}-{end} "
                "(the file was altered)"
            )


def _read_exact(fh: BinaryIO, mv: memoryview, path: str) -> None:
    got = 0
    while got < len(mv):
        n = fh.readinto(mv[got:])  # type: ignore[attr-defined]
        if not n:
            raise CorruptCheckpoint(f"{path}: ends early (truncated while being read)")
        got += n


def _cover(targets: list[tuple[int, np.ndarray[Any, Any]]], f: StoredFile) -> list[Segment]:
    """Segments covering the whole file: the destinations, and the gaps between them."""
    out: list[Segment] = []
    pos = 0
    for off, dst in targets:
        if off < pos:
            raise CorruptCheckpoint(f"{f.path}: two tensors overlap at byte {off}")
        if off > pos:
            out.append((pos, off - pos, None))
        out.append((off, len(dst), dst))
        pos = off + len(dst)
    if pos < f.nbytes:
        out.append((pos, f.nbytes - pos, None))
    return out


def _split(segments: list[Segment], f: StoredFile) -> list[list[Segment]]:
    """The segments cut at the checksum's block boundaries, one list per block."""
    bb = f.checksum.block_bytes
    blocks: list[list[Segment]] = [[] for _ in f.checksum.digests]
    for off, length, dst in segments:
        pos, end = off, off + length
        while pos < end:
            cut = min(end, (pos // bb + 1) * bb)
            part = None if dst is None else dst[pos - off : cut - off]
            blocks[pos // bb].append((pos, cut - pos, part))
            pos = cut
    return blocks


def open_shard(
    root: str, step: int, shard: int, nshards: int
) -> tuple[dict[str, Any], StoredSource]:
    """The metadata and the source of one persisted shard; file sizes are checked here,
    contents as they are read.

    Raises:
        CorruptCheckpoint: a missing or truncated file, or a bad manifest.
    """
    fs, path = fsspec.core.url_to_fs(root)
    base = f"{path}/{shard_dir(step, shard, nshards)}"
    opener: Opener = _open_local if is_local(root) else functools.partial(fs.open, mode="rb")
    try:
        with fs.open(f"{base}/{MANIFEST}", "rb") as mf:
            manifest = json.load(mf)
        if not isinstance(manifest, dict):
            raise CorruptCheckpoint(f"{base}: the manifest is not a JSON object")
        if manifest.get("format") not in FORMATS:
            raise CorruptCheckpoint(f"{base}: unknown format {manifest.get('format')!r}")
        files = {}
        for name, info in manifest["files"].items():
            p, want = f"{base}/{name}", int(info["bytes"])
            size = int(fs.size(p))
            if size != want:
                raise CorruptCheckpoint(f"{p}: {size} bytes, the manifest says {want}")
            files[name] = StoredFile(p, size, Checksum.from_manifest(info, size, p))
        if "data" in manifest:
            data = {k: (str(r), int(o), int(n)) for k, (r, o, n) in manifest["data"].items()}
        else:  # the first format indexes the torch.save items; find the bytes inside them
            data = _locate(manifest["tensors"], files, opener)
        meta: dict[str, Any] = manifest["meta"]
        entries_of(meta, base)
    except CorruptCheckpoint:
        raise
    except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
        raise CorruptCheckpoint(f"{base}: unreadable manifest or file ({exc})") from exc
    return meta, StoredSource(base, files, data, opener)


def entries_of(meta: Any, where: str) -> list[Entry]:
    """The tensor entries of a shard's metadata.

    Raises:
        CorruptCheckpoint: metadata of the wrong shape or type.
    """
    try:
        entries = [Entry.from_json(e) for e in meta["entries"]]
    except (KeyError, IndexError, TypeError, ValueError, AttributeError, RecursionError) as exc:
        raise CorruptCheckpoint(f"{where}: malformed snapshot metadata ({exc!r:.200})") from None
    return entries


def _locate(
    items: dict[str, list[Any]], files: dict[str, StoredFile], opener: Opener
) -> dict[str, tuple[str, int, int]]:
    out = {}
    for name, (rel, off, length) in items.items():
        with opener(files[rel].path) as fh:
            out[name] = (rel, *_torchzip.tensor_data(fh, int(off), int(length)))
    return out


def read(root: str, step: int, shard: int, nshards: int) -> tuple[dict[str, Any], torch.Tensor]:
    """Reads one persisted shard back as ``(meta, uint8 buffer)`` in the snapshot layout,
    verifying every file's checksum.

    Raises:
        CorruptCheckpoint: a missing, truncated or altered file, or a bad manifest.
    """
    meta, src = open_shard(root, step, shard, nshards)
    entries = entries_of(meta, f"{root} step {step} shard {shard}")
    buf = torch.zeros(max((e.offset + e.nbytes for e in entries), default=0), dtype=torch.uint8)
    for e in entries:
        src.add(e, buf[e.offset : e.offset + e.nbytes].numpy())
    run_tasks(src.tasks(), _layout.IO_THREADS)
    return meta, buf
