"""What hang detection across hosts costs the controller, at 100k ranks.

A job of 12,500 hosts of 8 ranks: while it steps, the agents send no progress report,
and the controller's judge (``CollectiveWaitHang``) only notes each step's job frame and
polls. Timed: that, per step (median of ``--steps``). Then one stall: rank 99,999 asleep,
every other rank waiting in the collective: each host's report (one sample a rank, the
agent's own ``RankProgress``, sealed as the real JSON message is sent; the culprit's host
adds its look at the rank's process, a real process asleep) is made apart and not timed;
timed, on the controller's side: the reports parsed as ``report_samples`` does and
observed, then the poll that names the culprit. Printed: CPU per healthy step,
CPU and bytes of the stall.

Run: taskset -c 0 python benchmarks/bench_collective_wait.py  (one core)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from collector.types import JOB, Frame, Sample
from detectors.progress import HangLimits
from eagleeye.agents.waits import CollectiveWaitHang, RankProgress

HOSTS, PER_HOST = 12_500, 8


def _reports(limits: HangLimits, step: int, culprit_pid: int) -> list[bytes]:
    """Each host's progress report of the stall, as the JSON body the agent sends (with
    the culprit's host, its look at the culprit's process, an idle one)."""
    out = []
    culprit = HOSTS * PER_HOST - 1  # every rank waits but this one
    for host in range(HOSTS):
        ranks = list(range(host * PER_HOST, (host + 1) * PER_HOST))
        progress = RankProgress(f"node{host}", 0, ranks, limits, now=0.0)
        labels = {r: {"rank": str(r), "attempt": "0"} for r in ranks}
        progress.observe([Sample("step_time", 0.1, 0.0, lab, step) for lab in labels.values()], 1)
        waits = [Sample("in_collective", 0.2, 0.0, labels[r], step) for r in ranks if r != culprit]
        progress.observe(waits, 1.2)
        sent = progress.report(4.0, ranks, {culprit: culprit_pid} if culprit in ranks else {})
        out.append(json.dumps({"samples": [s.to_json() for s in sent]}).encode())
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=2000)
    args = p.parse_args()
    limits = HangLimits()
    judge = CollectiveWaitHang(HOSTS * PER_HOST, limits)
    times = []
    for step in range(args.steps):
        now = step * 0.1
        frame = Frame(JOB, step, now, {"step_time.median": 0.1})
        started = time.process_time()
        judge.job_step(frame, now)
        assert judge.poll(now) == []
        times.append(time.process_time() - started)
    last = (args.steps - 1) * 0.1
    asleep = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        reports = _reports(limits, args.steps - 1, asleep.pid)
    finally:
        asleep.kill()
        asleep.wait()
    started = time.process_time()
    for body in reports:
        samples = [Sample.from_json(row) for row in json.loads(body)["samples"]]
        judge.observe(samples, 0, last + 3.0)
    (found,) = judge.poll(last + 3.0 + limits.idle_s + 0.1)  # idle since its look
    stall_s = time.process_time() - started
    assert (found.kind, found.subject.rank) == ("hang", HOSTS * PER_HOST - 1)
    print(f"healthy step: {statistics.median(times) * 1e6:.1f} us CPU (median of {args.steps})")
    size = sum(len(b) for b in reports)
    print(
        f"one stall, {HOSTS * PER_HOST} ranks: {len(reports)} reports, {size / 1e6:.1f} MB, "
        f"{stall_s * 1e3:.0f} ms CPU to parse, observe and judge "
        f"({stall_s / (HOSTS * PER_HOST) * 1e6:.1f} us a rank)"
    )


if __name__ == "__main__":
    main()
