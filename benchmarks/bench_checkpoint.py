"""Checkpoint engine benchmark: blocking time of a save, restore time by tier, step overhead.

Everything runs in one process against one real holder process, on about 1 GiB of fp32
state, and is reported as ratios against baselines measured in the same run:

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/bench_checkpoint.py [--gib 1.0]

Run it with no other heavy job on the machine: the figures are memory-bandwidth bound.

Baselines: synchronous ``torch.save``; ``torch.distributed.checkpoint.async_save`` in thread
and process mode; for restores, ``torch.load(weights_only=True)`` plus a copy into the model,
``dcp.load`` in place, and our own storage tier, each cold (the files dropped from the
page cache first, as after a failure) and warm (the files in the page cache); for the
memory tier, a plain copy of the same bytes out of a mapped segment into the same tensors,
in 1 and 2 threads.
The step-overhead part trains a small model with a snapshot every step, blocking for the
copy and copying in the background, against no snapshot.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import socket
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from ft_runtime.ckpt import (
    CheckpointClient,
    CkptState,
    ClientConfig,
    HolderConfig,
    HolderProcess,
    Ring,
    StateWatcher,
    _shm,
)
from ft_runtime.ckpt._layout import run_tasks


def med(fn: Callable[[], object], reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def big_state(gib: float) -> dict[str, Any]:
    n = int(gib * (1 << 30) / 4 / 16)
    return {
        "model": {f"layer{i}.weight": torch.randn(n) for i in range(16)},
        "step": 0,
        "rng": torch.get_rng_state(),
    }


def port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def settle(watcher: StateWatcher, step: int) -> None:
    """Waits until ``step`` is persisted (or never was saved)."""
    done: set[int] = set()
    watcher.callback = lambda e: done.add(e.step) if e.state == CkptState.PERSISTENT else None
    deadline = time.monotonic() + 120
    while step > 0 and step not in done and time.monotonic() < deadline:
        watcher.poll()
        time.sleep(0.05)


def bench_saves(
    state: dict[str, Any], client: CheckpointClient, watcher: StateWatcher, tmp: Path, reps: int
) -> dict[str, float]:
    out: dict[str, float] = {}
    out["torch.save"] = med(lambda: torch.save(state, tmp / "sync.pt"), reps)
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

    for kind in (AsyncCheckpointerType.THREAD, AsyncCheckpointerType.PROCESS):
        times = []
        for i in range(reps + 1):  # the first call starts DCP's worker: steady state only
            target = str(tmp / f"dcp{i}")
            t0 = time.perf_counter()
            fut = dcp.async_save(state["model"], checkpoint_id=target, async_checkpointer_type=kind)
            times.append(time.perf_counter() - t0)
            fut.result()  # let it finish before the next one, as a trainer would
            shutil.rmtree(target, ignore_errors=True)
        out[f"dcp.async_save[{kind.value}]"] = statistics.median(times[1:])
    step = [0]

    def ours(wait: bool) -> float:
        settle(watcher, step[0])  # like dcp's .result(): the last save's background work done
        step[0] += 1
        t0 = time.perf_counter()
        assert client.save(state, step[0], wait=wait).ok
        return time.perf_counter() - t0

    ours(True)  # warm-up: the holder allocates the segments once, later saves reuse them
    ours(True)
    out["ours save (copy blocks)"] = statistics.median(ours(True) for _ in range(reps))
    calls = []
    for _ in range(reps):
        calls.append(ours(False))
        client.fence()
    out["ours save(wait=False) call"] = statistics.median(calls)
    settle(watcher, step[0])
    return out


def uncache(root: Path) -> None:
    """Drops ``root`` (a file, or a directory's files) from the page cache: a restarted job
    reads them from disk."""
    for p in [root] if root.is_file() else root.rglob("*"):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)


def memcpy_baseline(template: dict[str, Any], shm_dir: Path, reps: int) -> dict[str, float]:
    """The floor of a memory-tier restore: one copy of the same bytes out of an already
    mapped shared-memory segment (4 KiB pages, as the holder's) into the template's tensors,
    in 1 and 2 threads; and, for reference, a copy between two huge-page numpy buffers."""
    dsts = [t.view(-1).view(torch.uint8).numpy() for t in template["model"].values()]
    nbytes = sum(len(d) for d in dsts)
    path = shm_dir / f"bench-floor-{uuid.uuid4().hex[:8]}"
    _shm.create(path, nbytes)
    seg = _shm.open_mapping(path, nbytes, populate=True)
    try:
        src = seg.buf.numpy()
        src[:] = 1  # every page of the segment written, as a snapshot's are
        chunk, jobs, off = 16 << 20, [], 0
        for d in dsts:
            for i in range(0, len(d), chunk):
                part = d[i : i + chunk]
                jobs.append(functools.partial(np.copyto, part, src[off + i : off + i + len(part)]))
            off += len(d)
        out = {
            "copy floor, segment -> tensors, 1 thread": med(lambda: run_tasks(jobs, 1), reps),
            "copy floor, segment -> tensors, 2 threads": med(lambda: run_tasks(jobs, 2), reps),
        }
    finally:
        seg.close()
        path.unlink()
    a = np.ones(nbytes, dtype=np.uint8)
    b = np.zeros_like(a)
    b[:] = a
    out["memcpy between huge-page numpy buffers"] = med(lambda: np.copyto(b, a), reps)
    return out


def bench_restores(
    client: CheckpointClient,
    storage_client: CheckpointClient,
    tmp: Path,
    template: dict[str, Any],
    shm_dir: Path,
    reps: int,
) -> dict[str, float]:
    """Restores into an allocated template (a restarted trainer's built model), every tier."""
    import torch.distributed.checkpoint as dcp

    def copy_into(loaded: dict[str, Any]) -> None:
        for k, t in template["model"].items():
            t.copy_(loaded["model"][k])

    out = {"ours load(into), memory tier": med(lambda: client.load(into=template), reps)}
    out.update(memcpy_baseline(template, shm_dir, reps))
    out["ours load(), memory tier, new tensors"] = med(lambda: client.load(), reps)
    got = storage_client.load(into=template)
    assert got is not None, "nothing persisted"
    assert got.tier.value == "storage", got.tier
    dcp.save(template["model"], checkpoint_id=str(tmp / "dcp_sync"))
    disk: dict[str, tuple[Path, Callable[[], object]]] = {
        "ours load(into), storage tier": (
            tmp / "store",
            lambda: storage_client.load(into=template),
        ),
        "torch.load(weights_only) + copy": (
            tmp / "sync.pt",
            lambda: copy_into(torch.load(tmp / "sync.pt", weights_only=True)),
        ),
        "dcp.load (in place)": (
            tmp / "dcp_sync",
            lambda: dcp.load(template["model"], checkpoint_id=str(tmp / "dcp_sync")),
        ),
    }
    for name, (root, fn) in disk.items():
        # cold: what a restart after a failure sees, the files read from storage
        out[f"{name}, cold"] = med(lambda r=root, f=fn: (uncache(r), f()), reps)  # type: ignore[misc]
        fn()  # warm: the same files already in the page cache
        out[f"{name}, warm"] = med(fn, reps)
    return out


def bench_overhead(client: CheckpointClient, steps: int, rounds: int) -> dict[str, float]:
    """Step time with no checkpoint, with a save every step that blocks for its copy, and
    with one that copies in the background (``wait=False``, fenced before the next
    optimizer step)."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(512, 512) for _ in range(6)])
    opt = torch.optim.Adam(model.parameters())
    client.install_fence(opt)
    x = torch.randn(1024, 512)  # a step of 50-100 ms on 2 cores for ~19 MB of state
    modes = {"never": None, "every step, copy blocks": True, "every step, wait=False": False}

    def step(i: int, wait: bool | None) -> None:
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
        if wait is not None:
            state = {"model": model.state_dict(), "optim": opt.state_dict()}
            client.save(state, 10_000 + i, wait=wait)

    for wait in modes.values():  # warm-up of every path
        for i in range(5):
            step(i, wait)
    client.fence()
    times: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(rounds):  # paired rounds: a ratio per round cancels slow drifts in load
        for mode, wait in modes.items():
            t0 = time.perf_counter()
            for i in range(steps):
                step(i, wait)
            client.fence()
            times[mode].append((time.perf_counter() - t0) / steps)
    out = {m: statistics.median(t) for m, t in times.items()}
    for m in list(modes)[1:]:
        ratios = [a / b for a, b in zip(times[m], times["never"], strict=True)]
        out[f"ratio {m}"] = statistics.median(ratios)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument(
        "--shm-dir",
        default="/dev/shm",
        help="the holders' tmpfs (e.g. one mounted with huge=within_size)",
    )
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-ckpt-"))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(port()))
    dist.init_process_group("gloo", rank=0, world_size=1)  # async_save needs a group
    ring = Ring((("node0", f"tcp://127.0.0.1:{port()}"),))
    job = f"bench{uuid.uuid4().hex[:6]}"
    cfg = HolderConfig(
        job,
        "node0",
        ring,
        storage=str(tmp / "store"),
        persist_every=1,
        keep_last=1,
        keep_in_memory=1,
        mem_cap_bytes=8 << 30,
        shm_dir=a.shm_dir,
    )
    # the overhead run: snapshots every step, persisted every 1000 (long-tail persistence)
    ring2 = Ring((("node0", f"tcp://127.0.0.1:{port()}"),))
    cfg2 = HolderConfig(
        job + "o",
        "node0",
        ring2,
        storage=str(tmp / "store2"),
        persist_every=1000,
        keep_in_memory=1,
        shm_dir=a.shm_dir,
    )
    holder, holder2 = HolderProcess(cfg).launch(), HolderProcess(cfg2).launch()
    try:
        holder.wait_ready()
        holder2.wait_ready()
        client = CheckpointClient(ClientConfig("node0", ring))
        watcher = StateWatcher(ring, lambda e: None)
        state = big_state(a.gib)
        nbytes = sum(t.numel() * 4 for t in state["model"].values())
        print(f"state: {nbytes / (1 << 30):.2f} GiB in {len(state['model'])} tensors")
        print(f"segments in {a.shm_dir}, huge pages: {_shm.huge_pages(a.shm_dir)}")
        saves = bench_saves(state, client, watcher, tmp, a.reps)
        # a restarted node: its holder is up but empty, so only storage has the state
        storage_only = CheckpointClient(ClientConfig("node0", ring2, storage=str(tmp / "store")))
        client.close()  # restores run in a fresh client, as in a restarted trainer
        template = {"model": {k: torch.zeros_like(v) for k, v in state["model"].items()}}
        restores = bench_restores(
            CheckpointClient(ClientConfig("node0", ring)),
            storage_only,
            tmp,
            template,
            Path(cfg.shm_dir),
            a.reps,
        )
        del state
        overhead = bench_overhead(CheckpointClient(ClientConfig("node0", ring2)), a.steps, a.rounds)
    finally:
        holder.stop()
        holder2.stop()
        dist.destroy_process_group()
        shutil.rmtree(tmp, ignore_errors=True)
    for k, v in {**saves, **restores}.items():
        print(f"{k:45s} {v * 1000:10.1f} ms")
    ours = saves["ours save(wait=False) call"]
    copy = saves["ours save (copy blocks)"]
    print(f"torch.save / ours(copy)              {saves['torch.save'] / copy:8.1f}x")
    print(f"torch.save / ours(wait=False)        {saves['torch.save'] / ours:8.1f}x")
    for k in ("dcp.async_save[thread]", "dcp.async_save[process]"):
        print(
            f"ours(copy) / {k:24s} {copy / saves[k]:8.2f}   ours(wait=False) / it "
            f"{ours / saves[k]:8.3f}"
        )
    mem = restores["ours load(into), memory tier"]
    for k in restores:
        if k != "ours load(into), memory tier":
            print(f"restore: {k:42s} / ours memory tier {restores[k] / mem:8.1f}x")
    for base in ("torch.load(weights_only) + copy", "dcp.load (in place)"):
        for temp in ("cold", "warm"):
            ours_st = restores[f"ours load(into), storage tier, {temp}"]
            ratio = ours_st / restores[f"{base}, {temp}"]
            print(f"restore: ours storage tier / {base}, {temp}: {ratio:.2f}")
    print(f"step time never {overhead['never'] * 1000:.1f} ms")
    for m in ("every step, copy blocks", "every step, wait=False"):
        print(
            f"step time {m} {overhead[m] * 1000:.1f} ms: overhead "
            f"{100 * (overhead[f'ratio {m}'] - 1):+.1f} % (median of paired rounds)"
        )
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
