"""Persistence of snapshot shards: DCP layout, a checksummed manifest, atomic publish.

Layout under the storage root (a directory or an fsspec URL)::

    step_0000000042/shard_0-of-2/{.metadata, __0_0.distcp, manifest.json}

Each shard directory is a ``torch.distributed.checkpoint`` checkpoint of the flat shard
tensors, so ``dcp.load`` reads it. Our own loader never touches the pickled ``.metadata``:
it reads ``manifest.json`` (JSON), verifies every file's sha256 and reads each tensor's
byte range with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import re
import shutil
import tempfile
import uuid
import warnings
from pathlib import Path
from typing import Any

import fsspec  # type: ignore[import-untyped]
import torch
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from ft_runtime.ckpt._layout import Entry, view
from ft_runtime.errors import CheckpointError

MANIFEST = "manifest.json"
FORMAT = "eagleeye-ckpt/1"
_STEP = re.compile(r"^step_(\d+)$")
_SHARD = re.compile(r"^shard_(\d+)-of-(\d+)$")


class CorruptCheckpoint(CheckpointError):
    """A persisted shard fails verification (checksum, size or manifest)."""


def shard_dir(step: int, shard: int, nshards: int) -> str:
    return f"step_{step:010d}/shard_{shard}-of-{nshards}"


def _is_local(root: str) -> bool:
    return "://" not in root or root.startswith("file://")


def _local(root: str) -> Path:
    return Path(root.removeprefix("file://"))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()


def _write_shard(
    tmp: Path, buf: torch.Tensor, meta: dict[str, Any], step: int, shard: int, nshards: int
) -> None:
    """Writes one shard directory (DCP files, then the manifest) into ``tmp``, fsynced."""
    entries = [Entry.from_json(e) for e in meta["entries"]]
    sd = {e.name: view(buf, e) for e in entries}
    writer = FileSystemWriter(str(tmp), single_file_per_rank=True, sync_files=True, thread_count=1)
    md = _dcp_save(sd, writer)
    tensors = {
        idx.fqn: [info.relative_path, info.offset, info.length]
        for idx, info in md.storage_data.items()
    }
    files = {
        p.name: {"sha256": _sha256(p), "bytes": p.stat().st_size} for p in sorted(tmp.iterdir())
    }
    manifest = {
        "format": FORMAT,
        "step": step,
        "shard": shard,
        "nshards": nshards,
        "meta": meta,
        "tensors": tensors,
        "files": files,
    }
    with (tmp / MANIFEST).open("w") as f:
        json.dump(manifest, f)
        f.flush()
        os.fsync(f.fileno())
    _fsync_dir(tmp)


def _dcp_save(sd: dict[str, torch.Tensor], writer: FileSystemWriter) -> Any:
    """DCP's save, with its CheckpointException (a BaseException) turned into OSError."""
    try:
        with warnings.catch_warnings():
            # the holder is not a torch.distributed rank: single-process DCP is intended
            warnings.simplefilter("ignore", UserWarning)
            return dcp_save(sd, storage_writer=writer, no_dist=True)
    except CheckpointException as exc:
        inner = [f[0] if isinstance(f, tuple) else f for f in exc.failures.values()]
        for e in inner:
            if isinstance(e, OSError):
                raise OSError(e.errno, f"{e.strerror} (writing {writer.path})") from None
        raise OSError(f"torch.distributed.checkpoint save failed: {inner}") from None


def _check_space(root: Path, nbytes: int, cause: OSError | None = None) -> None:
    """Raises ENOSPC with the numbers when ``root`` cannot take ``nbytes`` more (plus
    serialisation overhead), or, after a failed write (``cause``), when it is full."""
    free = shutil.disk_usage(root).free
    need = int(nbytes * 1.05) + (1 << 16)
    if free < need:
        raise OSError(
            errno.ENOSPC,
            f"No space left on device: {root} has {free} bytes free, a checkpoint needs "
            f"about {need}" + (f" ({cause})" if cause else ""),
        )


def persist(
    root: str,
    buf: torch.Tensor,
    meta: dict[str, Any],
    step: int,
    shard: int,
    nshards: int,
    keep_last: int,
) -> str:
    """Persists one shard atomically and applies retention; returns its final location.

    The shard is written under a temporary name, fsynced and renamed, so a reader sees it
    whole or not at all. Raises OSError (e.g. ENOSPC) with the temporary files removed.
    """
    rel = shard_dir(step, shard, nshards)
    stage_root = _local(root) if _is_local(root) else Path(tempfile.mkdtemp(prefix="eeckpt-"))
    final = stage_root / rel
    tmp = final.parent / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    try:
        _check_space(stage_root, buf.numel())
        try:
            _write_shard(tmp, buf, meta, step, shard, nshards)
        except OSError as exc:
            # torch.save reports a short write as a RuntimeError; name the real cause
            _check_space(stage_root, 0, cause=exc)
            raise
        if _is_local(root):
            if final.exists():
                shutil.rmtree(final)
            tmp.rename(final)
            _fsync_dir(final.parent)
        else:
            fs, path = fsspec.core.url_to_fs(root)
            fs.put(str(tmp), f"{path}/{rel}.tmp", recursive=True)
            fs.mv(f"{path}/{rel}.tmp", f"{path}/{rel}", recursive=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if not _is_local(root):
            shutil.rmtree(stage_root, ignore_errors=True)
    retain(root, shard, nshards, keep_last)
    return f"{root.rstrip('/')}/{rel}"


def catalog(root: str) -> list[tuple[int, int, int]]:
    """Every persisted ``(step, shard, nshards)`` with a manifest, newest step first."""
    fs, path = fsspec.core.url_to_fs(root)
    if not fs.exists(path):
        return []
    out = []
    for step_dir in fs.ls(path, detail=False):
        m = _STEP.match(os.path.basename(step_dir.rstrip("/")))
        if not m:
            continue
        for sd in fs.ls(step_dir, detail=False):
            s = _SHARD.match(os.path.basename(sd.rstrip("/")))
            if s and fs.exists(f"{sd}/{MANIFEST}"):
                out.append((int(m.group(1)), int(s.group(1)), int(s.group(2))))
    return sorted(out, reverse=True)


def retain(root: str, shard: int, nshards: int, keep_last: int) -> None:
    """Deletes this shard's persisted checkpoints older than the newest ``keep_last``."""
    fs, path = fsspec.core.url_to_fs(root)
    steps = sorted({st for st, sh, n in catalog(root) if sh == shard and n == nshards})
    for st in steps[: max(0, len(steps) - keep_last)]:
        target = f"{path}/{shard_dir(st, shard, nshards)}"
        fs.rm(f"{target}/{MANIFEST}")  # first, so a half-deleted shard is never loadable
        fs.rm(target, recursive=True)
        try:
            if not fs.ls(f"{path}/step_{st:010d}", detail=False):
                fs.rmdir(f"{path}/step_{st:010d}")
        except OSError:
            pass  # another shard's owner got there first, or is still writing


def read(root: str, step: int, shard: int, nshards: int) -> tuple[dict[str, Any], torch.Tensor]:
    """Reads one persisted shard back as ``(meta, uint8 buffer)``, verifying checksums.

    Raises:
        CorruptCheckpoint: a missing, truncated or altered file, or a bad manifest.
    """
    fs, path = fsspec.core.url_to_fs(root)
    base = f"{path}/{shard_dir(step, shard, nshards)}"
    try:
        with fs.open(f"{base}/{MANIFEST}", "rb") as f:
            manifest = json.load(f)
        if manifest.get("format") != FORMAT:
            raise CorruptCheckpoint(f"{base}: unknown format {manifest.get('format')!r}")
        blobs = {
            name: _verified(fs, f"{base}/{name}", info) for name, info in manifest["files"].items()
        }
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CorruptCheckpoint(f"{base}: unreadable manifest or file ({exc})") from exc
    meta = manifest["meta"]
    entries = [Entry.from_json(e) for e in meta["entries"]]
    size = max((e.offset + e.nbytes for e in entries), default=0)
    buf = torch.empty(size, dtype=torch.uint8)
    for e in entries:
        rel, off, length = manifest["tensors"][e.name]
        t = torch.load(io.BytesIO(blobs[rel][off : off + length]), weights_only=True)
        view(buf, e).copy_(t)
    return meta, buf


def _verified(fs: Any, path: str, info: dict[str, Any]) -> bytes:
    with fs.open(path, "rb") as f:
        data: bytes = f.read()
    if len(data) != info["bytes"]:
        raise CorruptCheckpoint(f"{path}: {len(data)} bytes, the manifest says {info['bytes']}")
    if hashlib.sha256(data).hexdigest() != info["sha256"]:
        raise CorruptCheckpoint(f"{path}: sha256 mismatch (the file was altered)")
    return data
