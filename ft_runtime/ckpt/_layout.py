"""Where each tensor's shard lives in a snapshot segment, and how to copy it there and back.

With ``D`` data-parallel replicas holding identical state, replica ``r`` stores elements
``[r*L, (r+1)*L)`` of every flattened tensor, ``L = ceil(numel / D)``; the last shards are
zero-padded to ``L`` so every replica's segment has the same layout. Shape, dtype and
``numel`` are recorded so the whole tensor can be reassembled from the ``D`` shards.
"""

from __future__ import annotations

import ctypes
import functools
import os
import zlib
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from ft_runtime.errors import CheckpointError

_ALIGN = 64  # every shard starts on a cache line, so a dtype view of the buffer is aligned
_DTYPES = {
    str(d).removeprefix("torch."): d
    for d in (
        torch.float64,
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
        torch.complex64,
        torch.complex128,
    )
}


@dataclass(frozen=True, slots=True)
class Entry:
    """One tensor's shard: ``shard_len`` elements at byte ``offset`` of the segment."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    numel: int
    shard_len: int
    offset: int

    def to_json(self) -> list[Any]:
        return [self.name, self.dtype, list(self.shape), self.numel, self.shard_len, self.offset]

    @classmethod
    def from_json(cls, v: Sequence[Any]) -> Entry:
        return cls(
            str(v[0]), str(v[1]), tuple(int(x) for x in v[2]), int(v[3]), int(v[4]), int(v[5])
        )

    @property
    def torch_dtype(self) -> torch.dtype:
        try:
            return _DTYPES[self.dtype]
        except KeyError:
            raise CheckpointError(f"unsupported dtype {self.dtype!r} in {self.name}") from None

    @property
    def nbytes(self) -> int:
        return self.shard_len * self.torch_dtype.itemsize


def crc32(buf: torch.Tensor) -> int:
    """The CRC-32 of a uint8 buffer: what a snapshot in memory is verified against."""
    return zlib.crc32(buf.numpy().data) if buf.numel() else 0


def verify_crc32(buf: torch.Tensor, meta: Mapping[str, Any], where: str) -> None:
    """Raises CheckpointError unless ``buf`` has the CRC-32 that ``meta`` records."""
    want = meta.get("crc32") if isinstance(meta, Mapping) else None
    if not isinstance(want, int) or isinstance(want, bool):
        raise CheckpointError(f"{where}: the snapshot carries no checksum")
    if crc32(buf) != want:
        raise CheckpointError(f"{where}: the snapshot's CRC-32 does not match (altered)")


def plan(tensors: Sequence[tuple[str, torch.Tensor]], nshards: int) -> tuple[list[Entry], int]:
    """Lays out the shards of ``tensors`` for ``nshards`` replicas; returns entries and size."""
    entries, offset = [], 0
    for name, t in tensors:
        dtype = str(t.dtype).removeprefix("torch.")
        if dtype not in _DTYPES:
            raise CheckpointError(f"tensor {name!r} has unsupported dtype {t.dtype}")
        numel = t.numel()
        e = Entry(name, dtype, tuple(t.shape), numel, -(-numel // nshards), offset)
        entries.append(e)
        offset += -(-e.nbytes // _ALIGN) * _ALIGN
    return entries, offset


def signature(tensors: Sequence[tuple[str, torch.Tensor]]) -> tuple[Any, ...]:
    """A key that changes whenever the layout would: names, dtypes and shapes."""
    return tuple((n, t.dtype, tuple(t.shape)) for n, t in tensors)


def view(buf: torch.Tensor, e: Entry) -> torch.Tensor:
    """The shard of ``e`` inside the uint8 buffer ``buf``, as a 1-D tensor of its dtype."""
    return buf[e.offset : e.offset + e.nbytes].view(e.torch_dtype)


def copy_in(
    buf: torch.Tensor,
    entries: Sequence[Entry],
    tensors: Sequence[tuple[str, torch.Tensor]],
    rank: int,
    hook: Callable[[int], None] | None = None,
    *,
    views: Sequence[torch.Tensor] | None = None,
) -> None:
    """Copies shard ``rank`` of each tensor into ``buf``; ``hook(i)`` runs after tensor i.

    A CPU tensor is one single-threaded memcpy that releases the GIL: torch's parallel
    copy (``copy_``, ``_foreach_copy_``) starts OpenMP workers that fight the training
    step's own threads for the cores, and measured several times slower on a busy host.
    CUDA tensors go in one ``_foreach_copy_`` (asynchronous, on the caller's stream).
    ``views`` are the entries' views of ``buf`` (:func:`view`), when the caller keeps them
    across saves.
    """
    dsts: list[torch.Tensor] = []
    srcs: list[torch.Tensor] = []
    for i, (e, (_, t)) in enumerate(zip(entries, tensors, strict=True)):
        dst = views[i] if views is not None else view(buf, e)
        lo = rank * e.shard_len
        n = max(0, min(e.numel, lo + e.shard_len) - lo)
        if n:
            src = t.detach().reshape(-1)[lo : lo + n]
            if hook is None and src.is_cuda:
                dsts.append(dst if n == e.shard_len else dst[:n])
                srcs.append(src)
            elif src.is_cuda:
                dst[:n].copy_(src, non_blocking=True)
            else:
                _memcpy(dst[:n], src)
        if n < e.shard_len:
            dst[n:].zero_()  # padding is zero so equal states give equal bytes
        if hook is not None:
            hook(i)
    if dsts:
        torch._foreach_copy_(dsts, srcs, non_blocking=True)


ByteCopy = tuple[np.ndarray[Any, Any], np.ndarray[Any, Any] | None]  # (dst, src or zeros)


def host_copies(
    views: Sequence[torch.Tensor],
    entries: Sequence[Entry],
    tensors: Sequence[tuple[str, torch.Tensor]],
    rank: int,
) -> list[ByteCopy] | None:
    """The byte copies of :func:`copy_in`, built once and replayed by :func:`run_copies` for
    as long as the same tensors are saved again; None unless every tensor is a contiguous
    CPU tensor.

    The source arrays are made from the tensors' addresses and keep no reference to them,
    so a cached plan holds no memory of a state the trainer dropped: replay it only after
    checking that the tensors being saved still have these addresses (:func:`addresses`).
    """
    out: list[ByteCopy] = []
    for dst_t, e, (_, t) in zip(views, entries, tensors, strict=True):
        if not (t.is_cpu and t.is_contiguous()):
            return None
        dst = dst_t.view(torch.uint8).numpy()
        lo = rank * e.shard_len
        n = max(0, min(e.numel, lo + e.shard_len) - lo)
        size = e.torch_dtype.itemsize
        if n:
            raw = (ctypes.c_uint8 * (n * size)).from_address(t.data_ptr() + lo * size)
            out.append((dst[: n * size], np.ctypeslib.as_array(raw)))
        if n < e.shard_len:
            out.append((dst[n * size :], None))  # padding is zero so equal states give equal bytes
    return out


def addresses(tensors: Sequence[tuple[str, torch.Tensor]]) -> tuple[tuple[int, bool, bool], ...]:
    """What a cached :func:`host_copies` plan depends on: each tensor's address, contiguity
    and device."""
    return tuple((t.data_ptr(), t.is_contiguous(), t.is_cpu) for _, t in tensors)


def run_copies(copies: Sequence[ByteCopy]) -> None:
    """Replays :func:`host_copies`: single-threaded memcpys that release the GIL."""
    for dst, src in copies:
        if src is None:
            dst.fill(0)
        else:
            np.copyto(dst, src)


Task = Callable[[], None]


class Source(Protocol):
    """Where one shard's bytes come from during a restore."""

    # True when its tasks mostly wait on storage: more threads than cores then help
    io_bound: bool

    def add(self, e: Entry, dst: np.ndarray[Any, Any]) -> None:
        """Asks for the first ``len(dst)`` bytes of ``e``'s shard to land in ``dst``."""

    def tasks(self) -> list[Task]:
        """The work that fills every ``dst`` added so far (the bulk of it releases the GIL)."""
        ...


class BufferSource:
    """A shard held in a uint8 tensor: a mapped holder segment (the memory tier), or bytes
    fetched from a peer."""

    io_bound = False

    def __init__(self, buf: torch.Tensor) -> None:
        self.buf = buf
        self._jobs: list[Task] = []

    def add(self, e: Entry, dst: np.ndarray[Any, Any]) -> None:
        """Raises CheckpointError when the buffer ends before the tensor does."""
        n = len(dst)
        if self.buf.numel() < e.offset + n:
            raise CheckpointError(f"the shard ends before tensor {e.name} does")
        src = self.buf[e.offset : e.offset + n].numpy()
        self._jobs += [
            functools.partial(np.copyto, dst[i : i + _CHUNK], src[i : i + _CHUNK])
            for i in range(0, n, _CHUNK)
        ]

    def tasks(self) -> list[Task]:
        jobs, self._jobs = self._jobs, []
        return jobs


_CHUNK = 16 << 20  # bytes per copy task: big tensors are split so every thread has work
IO_THREADS = 8  # threads for restores that read storage (measured: 2 -> 8 took 1.1 -> 0.8 s)


def _memcpy(dst: torch.Tensor, src: torch.Tensor) -> None:
    # A plain single-threaded memcpy (numpy releases the GIL): torch's parallel copy would
    # start OpenMP workers that fight the training step's own threads for the cores.
    np.copyto(dst.view(torch.uint8).numpy(), src.contiguous().view(torch.uint8).numpy())


def assemble(
    entries: Sequence[Entry],
    shards: Sequence[Source],
    into: Mapping[str, torch.Tensor] | None = None,
    threads: int | None = None,
) -> list[torch.Tensor]:
    """Rebuilds every whole tensor from the ``D`` shard sources, in order.

    A tensor of ``into`` with the entry's name is refused (CheckpointError) when its dtype
    or shape differs from the entry's. One with the entry's name, dtype and shape is
    filled in place (no new
    allocation, as a restarted trainer's model already holds its tensors); any other entry
    gets a new tensor. Each byte goes once, straight from the source into the tensor, by
    the sources' tasks (memory: copies of at most 16 MiB; storage: verified reads of one
    checksum block each) run in ``threads`` threads (default: up to 4, one per core, or 8
    when a source reads storage, whose reads wait on the device more than on a core).

    Raises:
        CheckpointError: a source cannot supply a tensor, or fails verification (then the
            tensors of ``into`` may hold partial content).
    """
    out: list[torch.Tensor] = []
    for e in entries:
        t = into.get(e.name) if into is not None else None
        if t is not None and (t.dtype != e.torch_dtype or tuple(t.shape) != e.shape):
            raise CheckpointError(
                f"tensor {e.name} is {e.dtype} {list(e.shape)} in the checkpoint, the target "
                f"is {str(t.dtype).removeprefix('torch.')} {list(t.shape)}"
            )
        fits = (
            t is not None
            and t.dtype == e.torch_dtype
            and tuple(t.shape) == e.shape
            and t.device.type == "cpu"
            and t.is_contiguous()
        )
        whole = (
            t.detach().view(-1)
            if fits and t is not None
            else torch.empty(e.numel, dtype=e.torch_dtype)
        )
        dst_bytes = whole.view(torch.uint8).numpy() if e.numel else None
        for r, src in enumerate(shards):
            lo = r * e.shard_len
            n = max(0, min(e.numel, lo + e.shard_len) - lo)
            if n and dst_bytes is not None:
                size = e.torch_dtype.itemsize
                try:
                    src.add(e, dst_bytes[lo * size : (lo + n) * size])
                except CheckpointError as exc:
                    raise type(exc)(f"shard {r}: {exc}") from exc
        out.append(t if fits and t is not None else whole.view(e.shape))
    if threads is None and any(src.io_bound for src in shards):
        threads = IO_THREADS
    run_tasks([task for src in shards for task in src.tasks()], threads)
    return out


def run_tasks(tasks: Sequence[Task], threads: int | None = None) -> None:
    """Runs ``tasks`` in ``threads`` threads (default: up to 4, one per core); the first
    error is raised once the running tasks are done, and the tasks not started are
    dropped."""
    n = threads or min(4, os.cpu_count() or 1)
    if n <= 1 or len(tasks) <= 1:
        for task in tasks:
            task()
        return
    with ThreadPoolExecutor(n, thread_name_prefix="ckpt-restore") as pool:
        futures = [pool.submit(task) for task in tasks]
        try:
            for fut in futures:
                fut.result()
        except BaseException:
            for fut in futures:
                fut.cancel()
            raise
