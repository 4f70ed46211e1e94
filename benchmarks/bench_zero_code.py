"""Cost of the zero-code telemetry beside the in-loop hook's, measured the same way.

One process, the reference GPT (as in bench_hook.py), three arms interleaved step by step
(bare / hook / zero-code) so that machine noise hits all alike; medians compared:

- bare: the loop alone;
- hook: the loop's own hook calls (step_start, five sections, step_end with five metrics)
  and the collective wrappers, as bench_hook.py measures them;
- zero-code: no call in the loop; what `eagleeye run` loads into an unmodified script
  (the optimizer step hook, the backward wrapper that keeps the loss, the collective
  wrappers) and, with ``--ddp``, DistributedDataParallel routed through the reference comm
  hook so its all-reduce is timed.

Also the median cost of one zero-code step's own work (optimizer hook, loss kept and read,
step closed and opened) on a tiny model, where nothing else hides it.

Run: python benchmarks/bench_zero_code.py [--steps 200] [--preset small] [--ddp]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from collector.autostep import AutoSteps
from collector.ddp import watch_ddp
from collector.hooks import TrainingHook
from collector.instrument import patch_collectives
from collector.transport import TelemetryPublisher, TelemetryReceiver
from eagleeye.workload.data import CharTokenizer, ShardedSampler, load_corpus
from eagleeye.workload.model import GPT, PRESETS, GPTConfig

ARMS = ("bare", "hook", "zero-code")


def drain(receiver: TelemetryReceiver, stop: threading.Event) -> None:
    while not stop.is_set():
        receiver.receive(timeout_s=0.05)


class ZeroCodeArm:
    """The zero-code instrumentation, installed only around the steps of its arm."""

    def __init__(self, hook: TrainingHook) -> None:
        self.steps = AutoSteps(hook)
        self.undo: list[Callable[[], None]] = []

    def __enter__(self) -> None:
        self.undo = [self.steps.install(), patch_collectives(self.steps.hook)]

    def __exit__(self, *exc: object) -> None:
        for undo in reversed(self.undo):
            undo()


def step_times(hook: TrainingHook, steps: int, preset: str, ddp: bool) -> dict[str, float]:
    """Median step time (s) of each arm."""
    text = load_corpus()
    tok = CharTokenizer(text)
    sampler = ShardedSampler(tok.encode(text), 64, 8, 0, 1, seed=0)
    # Each arm trains its own copy (same seed): under --ddp the zero-code arm's copy goes
    # through the reference comm hook, the others keep DDP's C++ all-reduce.
    runs = {arm: _model(tok.vocab_size, preset, ddp, watched=arm == "zero-code") for arm in ARMS}
    zero = ZeroCodeArm(hook)
    times: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for step in range(3 * steps + 15):
        arm = ARMS[step % 3]
        wrapped, opt, params = runs[arm]
        section = hook.section if arm == "hook" else (lambda name: nullcontext())
        with zero if arm == "zero-code" else nullcontext():
            started = time.perf_counter()
            if arm == "hook":
                hook.step_start(step)
            with section("data"):
                x, y = sampler.next_batch()
            with section("forward"):
                _, loss = wrapped(x, y)
            with section("backward"):
                opt.zero_grad()
                loss.backward()
            with section("allreduce"):
                if not ddp:
                    flat = torch.cat([p.grad.reshape(-1) for p in params])
                    dist.all_reduce(flat)
            with section("optimizer"):
                opt.step()
            value = loss.item()
            if arm == "hook":
                hook.step_end(step, loss=value, grad_norm=1.0, lr=1e-3, tokens=512.0)
            elapsed = time.perf_counter() - started
        hook.loop_steps = False  # the hook arm's steps must not silence the zero-code arm
        if step >= 15:
            times[arm].append(elapsed)
    return {arm: statistics.median(values) for arm, values in times.items()}


def _model(
    vocab: int, preset: str, ddp: bool, watched: bool
) -> tuple[torch.nn.Module, torch.optim.Optimizer, list[torch.nn.Parameter]]:
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=vocab, block_size=64, **PRESETS[preset]))
    wrapped: torch.nn.Module = model
    if ddp:
        undo = watch_ddp() if watched else (lambda: None)
        wrapped = DDP(model)  # watched: the comm hook goes in at its first forward
        undo()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return wrapped, opt, list(model.parameters())


def zero_code_call_cost(hook: TrainingHook, rounds: int = 5000) -> float:
    """Median µs of one zero-code step's own work on a model too small to hide it."""
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    x = torch.ones(1, 2)
    zero = ZeroCodeArm(hook)
    bare, instrumented = [], []
    for i in range(2 * rounds):
        with zero if i % 2 else nullcontext():
            loss = model(x).sum()
            t0 = time.perf_counter_ns()
            loss.backward()
            opt.step()
            t1 = time.perf_counter_ns()
        (instrumented if i % 2 else bare).append((t1 - t0) / 1000)
    return statistics.median(instrumented) - statistics.median(bare)


def ddp_hook_cost(rounds: int = 2000) -> float:
    """Median µs that routing one DDP bucket through the reference comm hook and the
    wrappers adds to a backward (one bucket, world of 1), against DDP's C++ all-reduce."""
    hook = TrainingHook(lambda labels, rows: True, {})
    undo = watch_ddp()
    watched = DDP(torch.nn.Linear(64, 64))
    undo()
    plain = DDP(torch.nn.Linear(64, 64))
    undo_wrappers = patch_collectives(hook)
    x = torch.ones(4, 64)
    costs: dict[bool, list[float]] = {False: [], True: []}
    try:
        for i in range(2 * rounds):
            model = watched if i % 2 else plain
            loss = model(x).sum()
            t0 = time.perf_counter_ns()
            loss.backward()
            costs[bool(i % 2)].append((time.perf_counter_ns() - t0) / 1000)
    finally:
        undo_wrappers()
        hook.close()
    return statistics.median(costs[True]) - statistics.median(costs[False])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--preset", default="small", choices=sorted(PRESETS))
    parser.add_argument("--ddp", action="store_true", help="train through DDP (world of 1)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    receiver = TelemetryReceiver()
    stop = threading.Event()
    threading.Thread(target=drain, args=(receiver, stop), daemon=True).start()
    publisher = TelemetryPublisher(receiver.address, high_water_mark=100_000)
    labels = {"rank": "0", "replica": "0", "node": "node0"}
    hook = TrainingHook(publisher.send, labels, queue_size=100_000)
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group(
            "gloo", store=dist.FileStore(f"{tmp}/store", 1), rank=0, world_size=1
        )
        cost = zero_code_call_cost(hook)
        bucket = ddp_hook_cost()
        medians = step_times(hook, args.steps, args.preset, args.ddp)
        dist.destroy_process_group()
    hook.close()
    stop.set()
    bare = medians["bare"]
    loop = "DDP" if args.ddp else "flat all-reduce"
    print(f"step time, {args.preset} preset, {loop}, {args.steps} interleaved triples:")
    for arm in ARMS:
        change = 100 * (medians[arm] / bare - 1)
        print(f"  {arm:10s} {medians[arm] * 1e3:8.2f} ms  {change:+6.2f} %")
    print(
        f"zero-code work per step: {cost:.2f} µs = {100 * cost * 1e-6 / bare:.3f} % of the "
        f"bare step (budget 0.5 %)"
    )
    print(f"DDP bucket through the comm hook and wrappers: {bucket:+.2f} µs per bucket")
    print(f"telemetry dropped: {hook.dropped + publisher.dropped}")


if __name__ == "__main__":
    main()
