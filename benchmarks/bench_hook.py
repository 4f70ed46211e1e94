"""Cost of the in-loop hook: per call, and on the step time of the reference workload.

Two measurements in one process:

1. The median cost of each hook call (step_start, section enter+exit, a timed collective,
   step_end with five metrics), over many calls, with a real ZeroMQ transport draining to
   a receiver in this process.
2. The step time of the reference GPT with full instrumentation (sections, metrics, the
   collective wrappers around a real gloo all-reduce) against none, steps interleaved
   A/B/A/B so that machine noise hits both alike; medians compared.

Run: python benchmarks/bench_hook.py [--steps 300] [--preset small]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from contextlib import nullcontext

import torch
import torch.distributed as dist

from collector.hooks import TrainingHook
from collector.instrument import instrument_collectives
from collector.transport import TelemetryPublisher, TelemetryReceiver
from eagleeye.workload.data import CharTokenizer, ShardedSampler, load_corpus
from eagleeye.workload.model import GPT, PRESETS, GPTConfig


def drain(receiver: TelemetryReceiver, stop: threading.Event) -> None:
    while not stop.is_set():
        receiver.receive(timeout_s=0.05)


def per_call_costs(hook: TrainingHook, rounds: int = 20000) -> dict[str, float]:
    """Median µs of each kind of hook call."""
    costs: dict[str, list[float]] = {
        "step_start": [],
        "section": [],
        "collective": [],
        "step_end(5 metrics)": [],
    }
    clock = time.perf_counter_ns
    for step in range(rounds):
        t0 = clock()
        hook.step_start(step)
        t1 = clock()
        with hook.section("forward"):
            pass
        t2 = clock()
        hook.record_collective("all_reduce", 1 << 20, "world", 0.001)
        t3 = clock()
        hook.step_end(step, loss=1.0, grad_norm=1.0, lr=0.1, tokens=512.0, skipped_step=0.0)
        t4 = clock()
        for name, (a, b) in zip(costs, [(t0, t1), (t1, t2), (t2, t3), (t3, t4)], strict=True):
            costs[name].append((b - a) / 1000)
    return {name: statistics.median(values) for name, values in costs.items()}


def step_overhead(hook: TrainingHook, steps: int, preset: str) -> tuple[float, float, int]:
    """Median step time (s) bare and instrumented, and the hook calls per step."""
    torch.manual_seed(0)
    text = load_corpus()
    tok = CharTokenizer(text)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=64, **PRESETS[preset]))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sampler = ShardedSampler(tok.encode(text), 64, 8, 0, 1, seed=0)
    params = list(model.parameters())
    times: dict[bool, list[float]] = {False: [], True: []}
    for step in range(2 * steps + 10):
        instrumented = step % 2 == 1
        section = hook.section if instrumented else (lambda name: nullcontext())
        started = time.perf_counter()
        if instrumented:
            hook.step_start(step)
        with section("data"):
            x, y = sampler.next_batch()
        with section("forward"):
            _, loss = model(x, y)
        with section("backward"):
            opt.zero_grad()
            loss.backward()
        with section("allreduce"):
            flat = torch.cat([p.grad.reshape(-1) for p in params])
            if instrumented:
                with instrument_collectives(hook):
                    dist.all_reduce(flat)
            else:
                dist.all_reduce(flat)
        with section("optimizer"):
            opt.step()
        if instrumented:
            hook.step_end(
                step, loss=loss.item(), grad_norm=1.0, lr=1e-3, tokens=512.0, skipped_step=0.0
            )
        else:
            loss.item()
        if step >= 10:  # warm-up steps are not measured
            times[instrumented].append(time.perf_counter() - started)
    calls = 1 + 5 + 1 + 1  # step_start, five sections, one collective, step_end
    return statistics.median(times[False]), statistics.median(times[True]), calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--preset", default="small", choices=sorted(PRESETS))
    args = parser.parse_args()
    torch.set_num_threads(1)
    receiver = TelemetryReceiver()
    stop = threading.Event()
    threading.Thread(target=drain, args=(receiver, stop), daemon=True).start()
    publisher = TelemetryPublisher(receiver.address, high_water_mark=100_000)
    hook = TrainingHook(
        publisher.send, {"rank": "0", "replica": "0", "node": "node0"}, queue_size=100_000
    )
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group(
            "gloo", store=dist.FileStore(f"{tmp}/store", 1), rank=0, world_size=1
        )
        costs = per_call_costs(hook)
        bare, full, calls = step_overhead(hook, args.steps, args.preset)
        dist.destroy_process_group()
    hook.close()
    stop.set()
    print("median cost per hook call:")
    for name, micros in costs.items():
        print(f"  {name:22s} {micros:7.2f} µs")
    worst = max(costs.values())
    print(f"  worst median           {worst:7.2f} µs (budget 20 µs)")
    print(f"step time, {args.preset} preset, {args.steps} interleaved pairs:")
    print(
        f"  bare {bare * 1e3:.2f} ms, instrumented {full * 1e3:.2f} ms, "
        f"measured overhead {100 * (full / bare - 1):+.2f} %"
    )
    estimate = calls * statistics.mean(costs.values()) * 1e-6 / bare
    print(
        f"  hook calls per step {calls}: {100 * estimate:.3f} % of the step by call cost "
        f"(budget 0.5 %)"
    )
    print(f"  telemetry dropped: {hook.dropped + publisher.dropped}")


if __name__ == "__main__":
    main()
