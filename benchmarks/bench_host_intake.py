"""The controller's intake of telemetry reduced on the hosts, at 100k ranks.

12,500 simulated hosts of 8 ranks each. Each step, every host's summary is made by the
agents' own code (``summarise`` over its 8 ranks' values of the hook's step report plus
the peer features; one host in a hundred has a rank that stands out) and sealed as the
real message (``encode_summary``): this is the agents' work and is not timed. Timed, on
the controller's side: the step's messages through ``Membership.receive_all``, as
``poll`` hands over a drained socket (each one's connection's agent and MAC; then the
headers, names and statistics checked together, the replay check, the intake), then the
step reduced across hosts (``SummaryIntake.frames``) and the frames stored and judged by
the controller's detectors (``JobCoordinator._detect``, the hosts' medians compared with
each other among them). Printed: controller CPU per step (median of the steps,
``time.process_time``, with the split of that median step), the comparison of the hosts
alone (this thread's CPU: the process's counts the run store's writer thread whenever it
runs) and bytes per step.

Side by side, the intake of raw per-rank samples as `eagleeye run`'s controller takes
them: one message per rank per step (the hook's step report: step time, sections,
metrics and six collectives), HMAC checked, decoded, stored and turned into frames. It is
measured on ``--raw-ranks`` ranks and scaled to 100k (it is linear in the messages).
Receiving from the socket is measured apart (``recv`` line): the 12,500 messages of one
step through a loopback ROUTER socket.

Run: taskset -c 0 python benchmarks/bench_host_intake.py  (one core, nothing heavy beside it)
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

import zmq

from benchmarks.bench_intake import batch
from collector.transport import TelemetryReceiver
from detectors.types import Finding
from eagleeye.agents import Membership
from eagleeye.agents.coordinator import JobCoordinator
from eagleeye.agents.hostjudge import HostJudge
from eagleeye.agents.intake import HostMedians
from eagleeye.agents.summary import encode_summary, summarise
from eagleeye.agents.wire import Message, seal
from eagleeye.detection import peer_features
from eagleeye.ingest import ingest_samples
from eagleeye.store import RunStore
from ft_runtime.layout import JobLayout

SECRET = b"0123456789abcdef0123456789abcdef"
SECTIONS = ("data", "forward", "backward", "opt")


def rank_values(rng: random.Random, slow: bool) -> dict[str, float]:
    """One rank's step as the agent has it: the hook's report plus the peer features."""
    compute = 0.8 * (1.6 if slow else 1.0) * rng.uniform(0.98, 1.02)
    values = {
        "step_time": 1.0 * rng.uniform(0.99, 1.01),
        "collective_time": 1.0 - compute,
        "loss": 2.0 * rng.uniform(0.99, 1.01),
        "grad_norm": rng.uniform(0.9, 1.1),
        "lr": 3e-4,
        "tokens": 4096.0,
        "skipped_step": 0.0,
    }
    values.update({f"section.{s}": compute / 4 * rng.uniform(0.98, 1.02) for s in SECTIONS})
    return peer_features(values)


def timed_hosts(coordinator: JobCoordinator) -> list[float]:
    """The CPU time of the calling thread in each step's comparison of the hosts (the
    process's CPU also counts the run store's writer thread, whenever it runs)."""
    peers = coordinator._judge.hosts
    assert peers is not None
    spent: list[float] = []
    judge = peers.judge

    def timed(step: HostMedians) -> list[Finding]:
        start = time.thread_time()
        found = judge(step)
        spent.append(time.thread_time() - start)
        return found

    peers.judge = timed  # type: ignore[method-assign]
    return spent


def agent_judge_cpu(per_host: int, steps: int = 400) -> tuple[float, float]:
    """An agent's judge of its ranks (``HostJudge``) over ``steps`` steps of
    ``per_host`` ranks: the median and 90th percentile of its CPU a step, the first 50
    steps (its warm-up) left out."""
    rng = random.Random(0)
    judge = HostJudge()
    spent = []
    for step in range(steps):
        values = {rank: rank_values(rng, False) for rank in range(per_host)}
        start = time.thread_time()
        judge.judge(0, step, {}, values, 100.0 + step)
        spent.append(time.thread_time() - start)
    kept = sorted(spent[50:])
    return statistics.median(kept), kept[int(0.9 * (len(kept) - 1))]


def summaries(hosts: int, per_host: int, step: int, seed: int) -> list:
    rng = random.Random(seed)
    out = []
    for host in range(hosts):
        slow = rng.randrange(per_host) if rng.random() < 0.01 else -1
        values = {host * per_host + r: rank_values(rng, r == slow) for r in range(per_host)}
        out.append(summarise(step, 0, values))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=12_500)
    ap.add_argument("--ranks-per-host", type=int, default=8)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--raw-ranks", type=int, default=5_000)
    args = ap.parse_args()
    hosts, per_host = args.hosts, args.ranks_per_host
    layout = JobLayout(nnodes=hosts, nproc_per_node=per_host)

    with tempfile.TemporaryDirectory() as tmp:
        store = RunStore(Path(tmp))
        members = Membership(SECRET, "tcp://127.0.0.1:0")
        coordinator = JobCoordinator(members, layout, store, clock=time.time)
        identities = [f"h{h}".encode() for h in range(hosts)]
        sessions = [f"{h:016x}" for h in range(hosts)]
        for h, identity in enumerate(identities):
            hello = Message("hello", f"agent-{h}", sessions[h], 1, {"node_rank": h})
            members.receive([identity, *seal(SECRET, hello)])
        cpu, wall, sizes, rows, per_message, reduction = [], [], [], [], [], []
        hosts_cpu = timed_hosts(coordinator)
        for step in range(args.steps):
            made = summaries(hosts, per_host, step, seed=step)
            sealed = [
                [identities[h], *encode_summary(s, SECRET, sessions[h], 2 + step)]
                for h, s in enumerate(made)
            ]
            sizes.append(sum(len(m[1]) + len(m[2]) for m in sealed))
            rows.append(sum(len(s.outliers) for s in made))
            c0, w0 = time.process_time(), time.perf_counter()
            members.receive_all(sealed)  # as ``poll`` hands over a drained socket
            c1 = time.process_time()
            assert coordinator.intake is not None
            frames = coordinator.intake.frames(hosts=hosts)
            c2 = time.process_time()
            coordinator._detect(frames)
            cpu.append(time.process_time() - c0)
            wall.append(time.perf_counter() - w0)
            per_message.append(c1 - c0)
            reduction.append(c2 - c1)
        assert not members.refused, members.refused
        taken = coordinator.intake.summaries
        recv_s = socket_receive(sealed)
        members.close()
        store.close()

        raw_cpu, raw_bytes = raw_intake(args.raw_ranks, Path(tmp) / "raw")
    ranks = hosts * per_host
    scale = ranks / args.raw_ranks
    step_cpu = statistics.median(cpu)
    print(f"{ranks:,} ranks on {hosts:,} hosts, {args.steps} steps, {taken:,} summaries taken")
    print(
        f"summaries: {statistics.median(sizes) / hosts:,.0f} bytes per host, "
        f"{statistics.median(sizes) / 1e6:.1f} MB per step, "
        f"{statistics.median(rows):.0f} outlier rows per step"
    )
    print(
        f"controller CPU per step, summaries: {step_cpu * 1e3:7.1f} ms  "
        f"(wall {statistics.median(wall) * 1e3:.1f} ms; budget 50 ms)"
    )
    middle = sorted(range(len(cpu)), key=cpu.__getitem__)[len(cpu) // 2]  # the median step
    messages_cpu, reduction_cpu = per_message[middle], reduction[middle]
    print(
        f"  of which, in that step, the messages (sender, MAC, replay, schema, intake): "
        f"{messages_cpu * 1e3:.1f} ms ({messages_cpu / hosts * 1e6:.2f} us a host); the "
        f"step's reduction across hosts: {reduction_cpu * 1e3:.1f} ms; storing and "
        f"detectors: {(step_cpu - messages_cpu - reduction_cpu) * 1e3:.1f} ms"
    )
    print(
        f"  of which the hosts compared with each other (HostPeers, this thread's CPU): "
        f"{statistics.median(hosts_cpu[1:]) * 1e3:.1f} ms (first step {hosts_cpu[0] * 1e3:.1f} ms)"
    )
    print(f"recv of one step's summaries from a loopback socket: {recv_s * 1e3:.1f} ms")
    judge_median, judge_p90 = agent_judge_cpu(per_host)
    print(
        f"an agent's judge of its {per_host} ranks: {judge_median * 1e3:.2f} ms a step "
        f"(90th percentile {judge_p90 * 1e3:.2f} ms)"
    )
    print(
        f"controller CPU per step, raw samples: {raw_cpu * scale * 1e3:7.0f} ms  "
        f"({raw_cpu / args.raw_ranks * 1e6:.1f} us a rank, measured on "
        f"{args.raw_ranks:,} ranks, scaled)"
    )
    print(
        f"bytes per step, raw samples: {raw_bytes * scale / 1e6:.1f} MB; "
        f"summaries carry {raw_bytes * scale / statistics.median(sizes):.0f}x fewer, "
        f"cost {raw_cpu * scale / step_cpu:.0f}x less CPU"
    )


def socket_receive(messages: list[list[bytes]]) -> float:
    """Seconds to take one step's messages off a loopback ROUTER socket."""
    context = zmq.Context.instance()
    router = context.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    router.setsockopt(zmq.RCVHWM, 0)
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.SNDHWM, 0)
    dealer.connect(f"tcp://127.0.0.1:{port}")
    for message in messages:
        dealer.send_multipart(message[1:])
    router.poll(5000)
    t0 = time.perf_counter()
    for _ in messages:
        router.recv_multipart()
    spent = time.perf_counter() - t0
    dealer.close(linger=0)
    router.close(linger=0)
    return spent


def raw_intake(ranks: int, run_dir: Path) -> tuple[float, int]:
    """CPU seconds and bytes for one step of ``ranks`` raw per-rank messages, as the
    one-host controller takes them (HMAC, decode, store, frames)."""
    key = b"k" * 32
    receiver = TelemetryReceiver(key=key, max_label_values=1 << 20)
    now = time.time()
    payloads = []
    for rank in range(ranks):
        payload = batch(now).replace(b'"rank":"3"', f'"rank":"{rank}"'.encode())
        payloads.append([payload, _sign(key, payload)])
    run_dir.mkdir()
    store = RunStore(run_dir)

    class _Frame:
        def __init__(self, data: bytes) -> None:
            self.bytes = data

    c0 = time.process_time()
    for start in range(0, len(payloads), 1000):  # a tick's worth at a time, as it drains
        samples = []
        for payload, mac in payloads[start : start + 1000]:
            samples += receiver._accept([_Frame(payload), _Frame(mac)])  # type: ignore[list-item]
        ingest_samples(store, samples)
    spent = time.process_time() - c0
    store.close()
    receiver.close()
    return spent, sum(len(p) + len(m) for p, m in payloads)


def _sign(key: bytes, payload: bytes) -> bytes:
    from collector.transport import sign

    return sign(key, payload)


if __name__ == "__main__":
    main()
