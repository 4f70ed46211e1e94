"""Shared-memory segments: files on a tmpfs that the holder owns and trainers map.

The holder creates and deletes segments; a trainer only maps them. A trainer killed with
SIGKILL therefore loses nothing: the pages belong to the file, not to the trainer.

A tmpfs mounted with ``huge=within_size`` (or ``huge=always``) backs the segments with
2 MiB pages: mapping one and copying through it then costs far fewer page-table entries and
TLB misses than on ``/dev/shm``'s usual 4 KiB pages (:func:`huge_pages` tells which).
"""

from __future__ import annotations

import errno
import mmap
import os
from pathlib import Path

import torch

from ft_runtime.errors import CheckpointError


def huge_pages(directory: str, mounts: str | None = None) -> bool:
    """True when ``directory`` lies on a tmpfs whose files get huge pages.

    ``mounts`` is the text of ``/proc/self/mounts`` (read when None; unreadable counts as
    no huge pages).

    >>> huge_pages("/dev/shm", "tmpfs /dev/shm tmpfs rw,relatime 0 0\\n")
    False
    >>> huge_pages("/mnt/snap/x", "tmpfs /mnt/snap tmpfs rw,size=8g,huge=within_size 0 0\\n")
    True
    """
    if mounts is None:
        try:
            mounts = Path("/proc/self/mounts").read_text()
        except OSError:
            return False
    target = os.path.realpath(directory)
    point, fstype, options = "", "", ""
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        inside = target == fields[1] or target.startswith(fields[1].rstrip("/") + "/")
        if inside and len(fields[1]) >= len(point):
            point, fstype, options = fields[1], fields[2], fields[3]
    return fstype == "tmpfs" and bool({"huge=always", "huge=within_size"} & set(options.split(",")))


def create(path: Path, size: int) -> None:
    """Creates a segment of ``size`` bytes with its pages allocated now.

    Allocating up front (fallocate) means a full tmpfs fails here, cleanly, rather than
    with SIGBUS in the middle of a trainer's copy.
    """
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        if size:
            os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        os.close(fd)
        path.unlink(missing_ok=True)
        if exc.errno == errno.ENOSPC:
            raise CheckpointError(
                f"no space for a {size}-byte snapshot segment in {path.parent}: "
                "lower keep_in_memory or mem_cap_bytes, or enlarge the tmpfs"
            ) from exc
        raise
    os.close(fd)


class Mapping:
    """A writable mapping of a segment, viewed as a uint8 tensor (``.buf``)."""

    def __init__(self, path: Path, size: int, populate: bool = False) -> None:
        self.path, self.size = path, size
        fd = os.open(path, os.O_RDWR)
        # populate: the kernel maps every page now, in one call, instead of one page fault
        # per 4 KiB during the copy (a restore reads the whole segment anyway)
        flags = mmap.MAP_SHARED | (mmap.MAP_POPULATE if populate else 0)
        try:
            # mmap cannot map zero bytes; a state without tensors still gets one page
            self._mm = mmap.mmap(fd, max(size, 1), flags=flags)
        finally:
            os.close(fd)
        self.buf = torch.frombuffer(self._mm, dtype=torch.uint8, count=max(size, 1))[:size]

    def close(self) -> None:
        del self.buf
        try:
            self._mm.close()
        except BufferError:
            pass  # a view is still alive; the mapping goes when it does


def open_mapping(path: Path, size: int, populate: bool = False) -> Mapping:
    """Maps an existing segment; a clear error if the holder no longer has it."""
    try:
        return Mapping(path, size, populate)
    except FileNotFoundError as exc:
        raise CheckpointError(f"snapshot segment {path} is gone (evicted or node lost)") from exc


def as_memoryview(buf: torch.Tensor) -> memoryview:
    """A writable byte view of a contiguous uint8 CPU tensor, for zmq frames and copies."""
    if buf.numel() == 0:
        return memoryview(bytearray())
    return memoryview(buf.numpy()).cast("B")  # type: ignore[arg-type]
