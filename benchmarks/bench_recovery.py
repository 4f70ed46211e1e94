"""Training time lost per failure: replica isolation against the synchronous full restart.

One process runs, back to back, the same workload (the reference GPT on 3 replicas of one
rank, 3 virtual nodes) three or four times: fault-free, with one rank SIGKILLed under
``--recovery job`` (every rank restarts from the last checkpoint), with the same kill
under ``--recovery replica`` (only its replica restarts and catches up), and with a SIGSTOP
under replica recovery. From each run's store it reports the effective training time ratio
(ETTR: useful replica-steps × median step time / training window) and the seconds lost;
for replica recovery also the survivors' step rate during the outage against steady state,
their longest stall, the sender's step time while it serves the catch-up, and how many
median step times it took to find the stopped rank.

The restarted replica's ranks start 10 nice levels lower until they have caught up;
``--nice-baseline`` adds the same kill with them at full priority, for comparison. The
sending replica's catch-up server threads run 10 nice levels below its training thread;
``--serve-baseline N`` adds N pairs of the same kill, one with the server at the training
thread's priority and one lowered, alternating, and reports the sender's step ratio of each.

``--stop-runs N`` repeats the SIGSTOP run; every run without a SIGSTOP is checked for
replicas the quorum isolated as hung (false hang findings).

One more fault-free replica run times the controller's ticks while a checkpoint command is
in flight (sent every ``--command-every`` ticks; the replicas answer once saved) against
the ticks with none: a command must never hold the tick, so its p99 may grow by at most
one tick (``tick_s``, 0.05 s). ``--no-ticks`` skips it.

Run: python benchmarks/bench_recovery.py [--steps 240] [--kill-step 40] [--preset small]
     [--nice-baseline] [--serve-baseline N] [--stop-runs N] [--no-stop] [--no-ticks]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from eagleeye.controller import Controller
from eagleeye.launch import JobConfig, run_job
from eagleeye.store import RunReader
from eagleeye.summary import effective_training
from ft_runtime.layout import JobLayout
from ft_runtime.replica.protocol import key_heartbeat
from ft_runtime.types import Action, ActionKind, Phase

LAYOUT = JobLayout(3, 1, 3)


def run(
    root: Path,
    name: str,
    args: argparse.Namespace,
    recovery: str,
    fault: str,
    joiner_nice: int = 10,
    serve_nice: int = 10,
) -> Path:
    workload = ["--preset", args.preset, "--steps", str(args.steps), "--batch-size", "2"]
    workload += ["--block-size", "32", "--checkpoint-every", str(args.checkpoint_every)]
    config = JobConfig(
        script="eagleeye.workload.train",
        module=True,
        script_args=workload,
        layout=LAYOUT,
        recovery=recovery,
        remediate=True,
        inject=(fault,) if fault else (),
        runs_dir=str(root),
        run_id=name,
        joiner_nice=joiner_nice,
        serve_nice=serve_nice,
    )
    result = run_job(config)
    if not result.succeeded:
        raise SystemExit(f"run {name} failed; see {result.run_dir}")
    return result.run_dir


def samples(run_dir: Path) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    reader = RunReader(run_dir)
    try:
        steps = reader.samples(names=["step_time", "replicas", "catch_up", "serving_catch_up"])
        return steps, reader.events(), reader.faults()
    finally:
        reader.close()


def ettr(run_dir: Path) -> tuple[float, float]:
    return effective_training(samples(run_dir)[0], LAYOUT.replicas)


def survivors(run_dir: Path, kill_step: int) -> dict[str, float]:
    """Replica recovery figures from replica 0's point of view (it never failed)."""
    steps, events, _ = samples(run_dir)
    mine = steps[(steps["rank"] == 0) & (steps["name"] == "step_time")].set_index("step")
    count = steps[(steps["rank"] == 0) & (steps["name"] == "replicas")].set_index("step")
    steady = statistics.median(mine.loc[5 : kill_step - 1, "value"])
    outage = count[count["value"] < LAYOUT.replicas].index
    during = mine.loc[outage[1:], "value"] if len(outage) > 1 else mine.loc[outage, "value"]
    caught = steps[(steps["name"] == "catch_up") & (steps["value"] > 0)]["step"]
    join = int(caught.min()) if not caught.empty else -1
    joining = mine.loc[join - 1 : join + 1, "value"] if join >= 0 else pd.Series([float("nan")])
    serving = steps[(steps["rank"] == 0) & (steps["name"] == "serving_catch_up")]
    sending = mine.loc[[s for s in serving[serving["value"] > 0]["step"] if s < join]]
    # The same outage without the sending: a fairer baseline on a machine where a survivor
    # speeds up whenever a rank is gone.
    idle = mine.loc[[s for s in outage[1:] if s not in sending.index and s < join - 1]]
    return {
        "steady_step_s": steady,
        "outage_steps": float(len(outage)),
        "rate_during_outage": steady / statistics.median(during),
        "stall_s": float(mine.loc[kill_step : kill_step + 1, "value"].max() - steady),
        "sender_steps_while_sending": float(len(sending)),
        "sender_step_ratio_while_sending": float(sending["value"].median() / steady),
        "sender_step_ratio_vs_outage_not_sending": float(
            sending["value"].median() / idle["value"].median()
        ),
        "sender_step_ratio_at_join": float(joining.max() / steady),
    }


def detection(run_dir: Path) -> tuple[float, float, float, float, bool]:
    """Seconds from a SIGSTOP to the quorum dropping the replica, the same in median
    steps, and the stall evidence: the hang limit then, how long the others waited, and
    whether the rank was found stopped (its process state) rather than by the limit."""
    steps, events, faults = samples(run_dir)
    stop = float(faults.iloc[0]["time"])
    drops = events[(events["subject"] == "quorum") & events["detail"].map(lambda d: "removed" in d)]
    delay = float(drops["time"].iloc[0]) - stop
    before = steps[(steps["name"] == "step_time") & (steps["time"] < stop)]
    fenced = events[events["detail"].map(_stall_evidence).map(bool)]
    evidence = _stall_evidence(fenced["detail"].iloc[0]) if len(fenced) else {}
    limit, waited = evidence.get("limit_s", float("nan")), evidence.get("waited_s", float("nan"))
    stopped = bool(evidence.get("stopped_ranks"))
    return delay, delay / float(before["value"].median()), float(limit), float(waited), stopped


def _stall_evidence(detail: object) -> dict[str, object]:
    """The stall evidence an isolation event carries (the limit, the wait, the ranks found
    stopped), or {}."""
    evidence = detail.get("evidence") if isinstance(detail, dict) else None
    return dict(evidence) if isinstance(evidence, dict) and "limit_s" in evidence else {}


def hang_isolations(run_dir: Path) -> int:
    """How many times the quorum dropped a replica as hung in this run."""
    events = samples(run_dir)[1]
    quorum = events[events["subject"] == "quorum"]["detail"]
    return sum(str(d.get("reason", "")).startswith("hung") for d in quorum)


def tick_latency(root: Path, args: argparse.Namespace) -> dict[str, float]:
    """Every tick of a fault-free replica run, timed; a checkpoint command is sent (as
    remediation would, inside the tick) every ``args.command_every`` ticks once training
    runs. Ticks that start with a command in flight are compared with those without."""
    ticks: list[tuple[float, bool]] = []
    original = Controller.tick

    def timed(self: Controller) -> None:
        sup = self.supervisor
        pending = getattr(sup, "pending", lambda: 0)
        start = time.perf_counter()
        due = len(ticks) % args.command_every == 0 and sup.phase is Phase.RUNNING
        if due and not pending() and training(sup):
            key = f"bench-checkpoint/{len(ticks)}"
            sup.execute(Action(ActionKind.CHECKPOINT, "job", "tick latency benchmark", key))
        in_flight = pending() > 0
        original(self)
        ticks.append((time.perf_counter() - start, in_flight))

    Controller.tick = timed  # type: ignore[method-assign]
    try:
        run_dir = run(root, "ticks", args, "replica", "")
    finally:
        Controller.tick = original  # type: ignore[method-assign]
    events = samples(run_dir)[1]
    commands = events[events["subject"].str.startswith("command:")]
    answered = [float(d["waited_s"]) for d in commands["detail"]]
    busy = [t for t, flying in ticks[20:] if flying]  # past the start-up ticks
    idle = [t for t, flying in ticks[20:] if not flying]
    return {
        "ticks_idle": float(len(idle)),
        "ticks_in_flight": float(len(busy)),
        "idle_p50_s": _percentile(idle, 50),
        "idle_p99_s": _percentile(idle, 99),
        "in_flight_p50_s": _percentile(busy, 50),
        "in_flight_p99_s": _percentile(busy, 99),
        "commands": float(len(commands)),
        "commands_done": float((commands["phase"] == "succeeded").sum()),
        "answer_wait_median_s": statistics.median(answered) if answered else float("nan"),
    }


def training(sup: object) -> bool:
    """Whether every rank has entered an exchange: a command sent before a rank reads the
    command count is not one it runs (it starts from the count it first sees)."""
    quorum = getattr(sup, "quorum", None)
    store = None if quorum is None else quorum.store
    if store is None:
        return False
    return bool(store.check([key_heartbeat(r) for r in range(LAYOUT.world_size)]))


def _percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=240)
    p.add_argument("--kill-step", type=int, default=40)
    p.add_argument("--preset", default="small")
    p.add_argument("--checkpoint-every", type=int, default=20)
    p.add_argument("--no-stop", action="store_true", help="skip the SIGSTOP runs")
    p.add_argument("--no-ticks", action="store_true", help="skip the tick-latency run")
    p.add_argument(
        "--command-every",
        type=int,
        default=20,
        metavar="N",
        help="tick-latency run: a checkpoint command every N ticks (default: 20)",
    )
    p.add_argument("--stop-runs", type=int, default=1, help="SIGSTOP runs (default: 1)")
    p.add_argument(
        "--nice-baseline",
        action="store_true",
        help="also run the replica kill with the joiner at full priority (joiner_nice 0)",
    )
    p.add_argument(
        "--serve-baseline",
        type=int,
        default=0,
        metavar="N",
        help="also run N pairs of the replica kill: catch-up server at the training "
        "thread's priority (serve_nice 0) and lowered (10), alternating",
    )
    args = p.parse_args()
    kill = f"kill:rank=1@step={args.kill_step}"
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        clean = ettr(run(root, "clean", args, "replica", ""))
        job = ettr(run(root, "job", args, "job", kill))
        replica_dir = run(root, "replica", args, "replica", kill)
        replica = ettr(replica_dir)
        figures = survivors(replica_dir, args.kill_step)
        baseline = None
        if args.nice_baseline:
            full = run(root, "replica-nice0", args, "replica", kill, joiner_nice=0)
            baseline = (ettr(full), survivors(full, args.kill_step))
        served: dict[int, list[dict[str, float]]] = {0: [], 10: []}
        for pair in range(args.serve_baseline):
            for nice in (0, 10):
                run_dir = run(root, f"serve{nice}-{pair}", args, "replica", kill, serve_nice=nice)
                served[nice].append(survivors(run_dir, args.kill_step))
        stop_spec = kill.replace("kill", "stop")
        stops = [
            detection(run(root, f"stop{n}", args, "replica", stop_spec))
            for n in range(0 if args.no_stop else args.stop_runs)
        ]
        false_hangs = sum(hang_isolations(d) for d in root.iterdir() if "stop" not in d.name)
    lost_clean = clean[1]
    print(f"fault-free: ETTR {clean[0]:.1%}, {clean[1]:.2f} s below the median pace")
    for name, (ratio, lost) in (("job restart", job), ("replica isolation", replica)):
        extra = lost - lost_clean
        print(f"{name}: ETTR {ratio:.1%}, lost {lost:.2f} s ({extra:.2f} s over fault-free)")
    ratio = (job[1] - lost_clean) / max(1e-9, replica[1] - lost_clean)
    print(f"time lost per failure, job restart / replica isolation: {ratio:.1f}x")
    for key, value in figures.items():
        print(f"replica recovery, {key}: {value:.3f}")
    if baseline is not None:
        (ratio0, lost0), figures0 = baseline
        print(f"joiner at full priority: ETTR {ratio0:.1%}, lost {lost0 - lost_clean:.2f} s")
        for key, value in figures0.items():
            print(f"joiner at full priority, {key}: {value:.3f}")
    if args.serve_baseline:
        for nice, runs in served.items():
            for key in (
                "sender_step_ratio_while_sending",
                "sender_step_ratio_vs_outage_not_sending",
            ):
                ratios = [figures[key] for figures in runs]
                shown = ", ".join(f"{r:.2f}" for r in ratios)
                print(
                    f"server at nice +{nice}, {key}: "
                    f"median {statistics.median(ratios):.2f}x ({shown})"
                )
    for delay, steps, limit, waited, stopped in stops:
        how = "found stopped" if stopped else "by the limit"
        print(
            f"SIGSTOP found after {delay:.3f} s = {steps:.2f} median step times, {how} "
            f"(hang limit {limit:.3f} s, the others waited {waited:.3f} s)"
        )
    print(f"replicas isolated as hung in the runs without a SIGSTOP: {false_hangs}")
    if not args.no_ticks:
        with tempfile.TemporaryDirectory() as tmp:
            ticks = tick_latency(Path(tmp), args)
        for key, value in ticks.items():
            print(f"controller tick, {key}: {value:.4f}")
        growth = ticks["in_flight_p99_s"] - ticks["idle_p99_s"]
        print(f"controller tick p99 with a command in flight vs idle: {growth * 1000:+.1f} ms")


if __name__ == "__main__":
    main()
