"""Persistence of snapshot shards: DCP layout, a checksummed manifest, atomic publish.

Layout under the storage root (a directory or an fsspec URL)::

    step_0000000042/shard_0-of-2/{.metadata, __0_0.distcp, manifest.json}

Each shard directory is a ``torch.distributed.checkpoint`` checkpoint of the flat shard
tensors, so ``dcp.load`` reads it. ``manifest.json`` (JSON) adds what our own loader
(``_stored``) needs instead of DCP's pickled ``.metadata``: each file's size and block
checksums (``_manifest``) and where each tensor's raw bytes lie in the ``.distcp`` file.
"""

from __future__ import annotations

import errno
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

from ft_runtime.ckpt import _manifest, _torchzip
from ft_runtime.ckpt._layout import Entry, view
from ft_runtime.ckpt._manifest import MANIFEST
from ft_runtime.ckpt._stored import is_local, shard_dir
from ft_runtime.errors import CheckpointError

_STEP = re.compile(r"^step_(\d+)$")
_SHARD = re.compile(r"^shard_(\d+)-of-(\d+)$")


def _local(root: str) -> Path:
    return Path(root.removeprefix("file://"))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
    files = {p.name: _file_entry(p) for p in sorted(tmp.iterdir())}
    manifest = {
        "format": _manifest.FORMAT,
        "step": step,
        "shard": shard,
        "nshards": nshards,
        "meta": meta,
        "tensors": tensors,
        "data": _locate_data(tmp, tensors, {e.name: e.nbytes for e in entries}),
        "files": files,
    }
    with (tmp / MANIFEST).open("w") as f:
        json.dump(manifest, f)
        f.flush()
        os.fsync(f.fileno())
    _fsync_dir(tmp)


def _file_entry(p: Path) -> dict[str, Any]:
    size = p.stat().st_size
    with p.open("rb", buffering=0) as f:
        return {
            "bytes": size,
            "checksum": _manifest.compute(f, size, _manifest.BLOCK_BYTES).to_json(),
        }


def _locate_data(
    tmp: Path, tensors: dict[str, list[Any]], nbytes: dict[str, int]
) -> dict[str, list[Any]]:
    """Where each tensor's raw bytes lie: ``{name: [file, offset, length]}``."""
    out: dict[str, list[Any]] = {}
    for name, (rel, off, length) in tensors.items():
        with (tmp / rel).open("rb") as f:
            try:
                start, n = _torchzip.tensor_data(f, off, length)
            except ValueError as exc:
                raise CheckpointError(f"DCP wrote tensor {name} in an unknown form: {exc}") from exc
        if n != nbytes[name]:
            raise CheckpointError(f"DCP wrote {n} bytes for tensor {name}, not {nbytes[name]}")
        out[name] = [rel, start, n]
    return out


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
    stage_root = _local(root) if is_local(root) else Path(tempfile.mkdtemp(prefix="eeckpt-"))
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
        if is_local(root):
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
        if not is_local(root):
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
