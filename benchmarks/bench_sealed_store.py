"""Cost of the sealed quorum store against a bare TCPStore client.

Every key of the replica-recovery store is stored under an opaque name and every value
sealed with the job's secret (``ft_runtime.replica.store``). This times what a rank does
with the store around each exchange (a heartbeat ``set``, a ``get``, a ``check``) through
both clients of one store, alternately, and compares the medians.

Run: python benchmarks/bench_sealed_store.py [--rounds 9] [--ops 2000]
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import timedelta

from ft_runtime import _dist as dist
from ft_runtime.replica.auth import JobSecret, new_secret
from ft_runtime.replica.protocol import Heartbeat, encode, key_heartbeat
from ft_runtime.replica.store import SealedStore


def _round(store: dist.Store, ops: int) -> float:
    """Microseconds per set + get + check."""
    value = encode(Heartbeat(1, 1))
    began = time.perf_counter()
    for i in range(ops):
        key = key_heartbeat(i % 8)
        store.set(key, value)
        store.get(key)
        store.check([key])
    return (time.perf_counter() - began) / ops * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--ops", type=int, default=2000)
    args = parser.parse_args()
    timeout = timedelta(seconds=30)
    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timeout)

    def client() -> dist.TCPStore:
        return dist.TCPStore("127.0.0.1", master.port, is_master=False, timeout=timeout)

    raw, sealed = client(), SealedStore(client(), JobSecret(new_secret()))
    bare, ours = [], []
    for _ in range(args.rounds):
        bare.append(_round(raw, args.ops))
        ours.append(_round(sealed, args.ops))
    b, o = statistics.median(bare), statistics.median(ours)
    print(f"set+get+check: TCPStore {b:.0f} us, SealedStore {o:.0f} us, ratio {o / b:.2f}")


if __name__ == "__main__":
    main()
