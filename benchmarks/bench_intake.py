"""Cost of checking every telemetry message at the controller's intake.

One typical batch (a step of the reference workload: step time, sections, metrics and six
collectives with their own labels) is decoded the way the controller does it (HMAC check,
then the schema of every field) and, for reference, parsed as JSON only. Printed: median
microseconds per message of each, and their ratio.

Run: python benchmarks/bench_intake.py [--rounds 20000]
"""

from __future__ import annotations

import argparse
import hmac
import json
import statistics
import time

from collector._wire import decode_message
from collector.transport import encode, sign

LABELS = {"rank": "3", "replica": "1", "node": "node1", "attempt": "0"}


def batch(now: float) -> bytes:
    rows: list[list[object]] = [["step_time", 0.105, now, 41]]
    rows += [[f"section.{s}", 0.01, now, 41] for s in ("data", "forward", "backward", "opt")]
    rows += [[m, 1.0, now, 41] for m in ("loss", "grad_norm", "lr", "tokens", "skipped_step")]
    for seq in range(6):
        extra = {"op": "all_reduce", "group": "world", "seq": str(seq), "bytes": "1048576"}
        rows.append(["collective", 0.002, now, 41, extra])
    return encode(LABELS, rows)


def median_us(call, rounds: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        call()
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times) / 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20000)
    rounds = ap.parse_args().rounds
    now = time.time()
    payload, key = batch(now), b"k" * 32
    mac = sign(key, payload)

    def checked() -> None:
        assert hmac.compare_digest(mac, sign(key, payload))
        decode_message(payload, now, 300.0)

    parsed = median_us(lambda: json.loads(payload), rounds)
    full = median_us(checked, rounds)
    print(f"message: {len(payload)} bytes, 16 samples")
    print(f"json.loads only:            {parsed:7.1f} us")
    print(f"HMAC + schema + samples:    {full:7.1f} us  ({full / parsed:.1f}x)")
    print(f"messages per second, one core, checked: {1e6 / full:,.0f}")


if __name__ == "__main__":
    main()
