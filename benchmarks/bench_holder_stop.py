"""How long a job's end waits for its snapshot holders: the ring of holders is started,
then stopped the way ``eagleeye.snapshots.Holders`` stops them (every one sent SIGTERM, then
each waited for), timed from the first SIGTERM to the last exit; against the same holders
stopped one at a time. Each stop ends an idle holder (no snapshot held), so what is timed
is the holder's own way out: its loop's poll, its worker, its process exit.

Run: python benchmarks/bench_holder_stop.py [--holders 2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import time

from ft_runtime.ckpt.config import HolderConfig, Ring
from ft_runtime.ckpt.launch import HolderProcess
from ft_runtime.ports import free_port


def _ring(n: int) -> list[HolderProcess]:
    ring = Ring(tuple((f"n{i}", f"tcp://127.0.0.1:{free_port()}") for i in range(n)))
    token = secrets.token_hex(8)
    job = f"bench{secrets.token_hex(3)}"
    holders = [
        HolderProcess(HolderConfig(job, node, ring, None, token=token)) for node, _ in ring.nodes
    ]
    for h in holders:
        h.launch()
    for h in holders:
        h.wait_ready()
    time.sleep(1.0)  # their workers' start-up exchange with their neighbours ends, as in a job
    return holders


def _stop(holders: list[HolderProcess], together: bool) -> float:
    started = time.monotonic()
    if together:
        for h in holders:
            assert h.proc is not None
            h.proc.terminate()
    for h in holders:
        assert h.proc is not None
        if not together:
            h.proc.terminate()
        h.proc.wait(timeout=60)
    return time.monotonic() - started


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--holders", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    together, one_by_one = [], []
    for _ in range(a.rounds):  # alternated: a loaded machine weighs on both alike
        one_by_one.append(_stop(_ring(a.holders), together=False))
        together.append(_stop(_ring(a.holders), together=True))
    t, s = statistics.median(together), statistics.median(one_by_one)
    print(f"{a.holders} holders, median of {a.rounds}: one at a time {s:.2f} s, "
          f"together {t:.2f} s, ratio {t / s:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
