"""A job that trains nothing: it prints a line every few seconds, then exits 0.

    python print_only.py --seconds 150 --every 5
"""

import argparse
import os
import time

parser = argparse.ArgumentParser()
parser.add_argument("--seconds", type=float, default=150.0)
parser.add_argument("--every", type=float, default=5.0)
args = parser.parse_args()

rank = os.environ.get("RANK", "0")
start = time.time()
n = 0
while time.time() - start < args.seconds:
    print(f"[rank {rank}] still working, {n} lines so far", flush=True)
    n += 1
    time.sleep(args.every)
print(f"[rank {rank}] finished after {time.time() - start:.0f} s", flush=True)
