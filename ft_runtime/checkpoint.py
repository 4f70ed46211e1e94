"""Synchronous checkpoints to a directory: the baseline that the checkpoint engine beats.

Layout, one folder per step::

    step-00000040/rank-00003.pt     the rank's state (torch.save of tensors and plain data)
    step-00000040/rank-00003.json   its size and SHA-256
    step-00000040/MANIFEST.json     written by rank 0 once every rank has saved

Every file is written atomically (temporary name, fsync, rename), so a crash mid-save leaves
no file that looks complete. A checkpoint counts only once its manifest exists. Loading
verifies the checksum and uses ``torch.load(weights_only=True)``: tensors and plain data,
never arbitrary objects. A corrupt or truncated checkpoint (or one whose manifest or
metadata is not what it should be) falls back to the previous one; when checkpoints exist
but none can be loaded, ``load`` raises :class:`CheckpointsUnusable` rather than answer
"no checkpoint". Given the target state (``like=``), a checkpoint whose tensors differ from
it in shape or dtype is refused the same way.

A failed write removes its temporary file. When the disk has less free space than the
save needs (or a write fails with ENOSPC), older checkpoints are removed first, keeping
the newest complete one, and the write is tried once more.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ft_runtime.errors import CheckpointError, CheckpointsUnusable

log = logging.getLogger(__name__)
MANIFEST = "MANIFEST.json"


@dataclass(frozen=True, slots=True)
class SavedCheckpoint:
    step: int
    path: str
    nbytes: int
    seconds: float


class DiskCheckpointer:
    """Saves and loads one rank's state.

    Args:
        directory: root folder of the job's checkpoints.
        rank: this rank; ``world_size``: ranks that save together.
        barrier: called after the rank's file is written, before rank 0 writes the
            manifest (``torch.distributed.barrier`` in a job); None: rank 0 waits until
            every rank's file is in the folder (ranks that save from a background thread).
        keep: complete checkpoints retained; older ones are deleted by rank 0.
        free_bytes: free space of a folder (``shutil.disk_usage`` by default).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        rank: int = 0,
        world_size: int = 1,
        barrier: Callable[[], None] | None = None,
        keep: int = 2,
        free_bytes: Callable[[Path], int] = lambda path: shutil.disk_usage(path).free,
    ) -> None:
        if keep < 1:
            raise CheckpointError(f"keep must be at least 1, got {keep}")
        self.directory = Path(directory)
        self.rank = rank
        self.world_size = world_size
        self.barrier = barrier
        self.keep = keep
        self.free_bytes = free_bytes

    def save(self, state: Mapping[str, Any], step: int) -> SavedCheckpoint:
        """Writes this rank's state for ``step``; raises CheckpointError if it cannot."""
        started = time.perf_counter()
        folder = self.directory / f"step-{step:08d}"
        buffer = io.BytesIO()
        torch.save(dict(state), buffer)
        payload = buffer.getbuffer()
        name = f"rank-{self.rank:05d}"
        meta = {
            "step": step,
            "rank": self.rank,
            "bytes": payload.nbytes,
            "sha256": hashlib.sha256(payload).hexdigest(),
        }
        try:
            folder.mkdir(parents=True, exist_ok=True)
            if self.free_bytes(folder) < 2 * payload.nbytes + (1 << 20):
                self._make_room(step)
            try:
                _atomic_write(folder / f"{name}.pt", payload)
            except OSError as exc:
                if exc.errno != errno.ENOSPC or not self._make_room(step):
                    raise
                _atomic_write(folder / f"{name}.pt", payload)
            _atomic_write(folder / f"{name}.json", json.dumps(meta).encode())
            if self.barrier is not None:
                self.barrier()
            elif self.rank == 0 and self.world_size > 1:
                _await_files(folder, self.world_size)
            if self.rank == 0:
                manifest = {"step": step, "world_size": self.world_size, "time": time.time()}
                _atomic_write(folder / MANIFEST, json.dumps(manifest).encode())
                self._retain()
        except OSError as exc:
            raise CheckpointError(
                f"cannot write checkpoint of step {step} to {folder}: {exc}"
            ) from exc
        return SavedCheckpoint(step, str(folder), payload.nbytes, time.perf_counter() - started)

    def complete_steps(self) -> list[int]:
        """Steps with a manifest, newest first."""
        steps = []
        for manifest in self.directory.glob(f"step-*/{MANIFEST}"):
            try:
                steps.append(int(manifest.parent.name.removeprefix("step-")))
            except ValueError:
                continue
        return sorted(steps, reverse=True)

    def load(
        self, at_most: int | None = None, like: Mapping[str, Any] | None = None
    ) -> tuple[int, dict[str, Any]] | None:
        """The newest complete, intact checkpoint of this rank as (step, state), or None
        when there is none; with ``at_most``, the newest of a step no later than that.

        Args:
            like: the state the checkpoint will be loaded into; a checkpoint missing one
                of its tensors, or holding one of another shape or dtype, is refused.

        Raises:
            CheckpointsUnusable: complete checkpoints exist but none could be loaded.
        """
        refused = []
        for step in self.complete_steps():
            if at_most is not None and step > at_most:
                continue
            try:
                state = self._load_step(step)
                if like is not None:
                    _check_like(state, like, "")
                return step, state
            except CheckpointError as exc:
                log.warning("skipping checkpoint of step %d: %s", step, exc)
                refused.append(f"step {step}: {exc}")
        if refused:
            raise CheckpointsUnusable(
                f"{len(refused)} checkpoint(s) in {self.directory} but none usable "
                f"({'; '.join(refused)[:500]}); remove them to start fresh"
            )
        return None

    def _load_step(self, step: int) -> dict[str, Any]:
        folder = self.directory / f"step-{step:08d}"
        name = f"rank-{self.rank:05d}"
        try:
            manifest = json.loads((folder / MANIFEST).read_text())
            meta = json.loads((folder / f"{name}.json").read_text())
            payload = (folder / f"{name}.pt").read_bytes()
        except (OSError, ValueError, RecursionError) as exc:
            raise CheckpointError(f"unreadable: {exc}") from None
        if not isinstance(manifest, dict) or not isinstance(meta, dict):
            raise CheckpointError(f"{MANIFEST} or {name}.json is not a JSON object")
        if manifest.get("world_size") != self.world_size:
            raise CheckpointError(
                f"saved by {manifest.get('world_size')} ranks, this job has {self.world_size}"
            )
        if len(payload) != meta.get("bytes") or hashlib.sha256(payload).hexdigest() != meta.get(
            "sha256"
        ):
            raise CheckpointError(f"{name}.pt is corrupt or truncated (checksum mismatch)")
        try:
            state = torch.load(io.BytesIO(payload), weights_only=True, map_location="cpu")
        except Exception as exc:  # the unpickler's errors have no common base
            raise CheckpointError(f"{name}.pt cannot be loaded as tensors: {exc}") from None
        if not isinstance(state, dict):
            raise CheckpointError(f"{name}.pt holds {type(state).__name__}, not a dict")
        return state

    def _retain(self) -> None:
        for step in self.complete_steps()[self.keep :]:
            shutil.rmtree(self.directory / f"step-{step:08d}", ignore_errors=True)

    def _make_room(self, saving: int) -> bool:
        """Space is short: removes every checkpoint but the newest complete one (and the
        one being saved), incomplete leftovers included; True if it removed any."""
        newest = next(iter(self.complete_steps()), None)
        removed = False
        for folder in self.directory.glob("step-*"):
            try:
                step = int(folder.name.removeprefix("step-"))
            except ValueError:
                continue
            if step not in (newest, saving):
                log.warning("disk space is short: removing checkpoint folder %s", folder)
                shutil.rmtree(folder, ignore_errors=True)
                removed = True
        return removed


def _check_like(state: Any, like: Any, where: str) -> None:
    """Raises CheckpointError where ``state`` lacks a tensor of ``like`` or holds it with
    another shape or dtype."""
    if isinstance(like, torch.Tensor):
        if not isinstance(state, torch.Tensor):
            raise CheckpointError(f"{where or 'state'} is {type(state).__name__}, not a tensor")
        if state.shape != like.shape or state.dtype != like.dtype:
            raise CheckpointError(
                f"{where.rstrip('.')} is {state.dtype} {list(state.shape)}, the target is "
                f"{like.dtype} {list(like.shape)}"
            )
    elif isinstance(like, Mapping):
        if not isinstance(state, Mapping):
            raise CheckpointError(f"{where or 'state'} is {type(state).__name__}, not a dict")
        for key, value in like.items():
            if key not in state:
                raise CheckpointError(f"{where}{key} is missing")
            _check_like(state[key], value, f"{where}{key}.")


def _await_files(folder: Path, count: int, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while len(list(folder.glob("rank-*.json"))) < count:
        if time.monotonic() > deadline:
            raise OSError(f"only some of {count} ranks saved to {folder} in {timeout_s:.0f} s")
        time.sleep(0.01)


def _atomic_write(path: Path, data: bytes | memoryview) -> None:
    """Writes ``path`` whole or not at all; a failed write leaves no temporary file."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
