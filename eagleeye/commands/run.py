"""`eagleeye run`: launch a training script on this machine, supervise it, record it."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from detectors.progress import NO_STEP_NOTICE_S
from eagleeye.commands._args import non_negative, positive, seconds
from eagleeye.commands.hang_flags import add_hang_arguments
from eagleeye.commands.service_flags import (
    add_metrics,
    add_policy,
    add_remediate,
    add_tls,
    add_webhook,
)
from ft_runtime.replica import config as replica_config


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "run",
        help="launch a training script as R replicas of M ranks and supervise it",
        description=(
            "Launches SCRIPT on this machine with torchrun-compatible environment variables "
            "(RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, ...), records per-step "
            "telemetry (zero-code, or the in-loop hook) into the run store, streams the "
            "ranks' output, detects faults and, with --remediate, acts on them (by default "
            "actions are only recorded: dry-run). SIGTERM or SIGINT ends every rank."
        ),
    )
    add_job_arguments(p)
    p.add_argument(
        "script",
        metavar="SCRIPT",
        nargs="?",
        help="training script (or module with -m); none with --resume",
    )
    p.add_argument(
        "script_args",
        nargs=argparse.REMAINDER,
        metavar="...",
        help="arguments passed to the script",
    )
    p.set_defaults(func=_run)


def add_job_arguments(p: argparse.ArgumentParser) -> None:
    """Flags shared by `run` and `demo`: the torchrun ones, replicas, store and recovery."""
    g = p.add_argument_group("layout (torchrun-compatible)")
    g.add_argument(
        "--nnodes", type=positive, default=1, help="virtual nodes on this machine (default: 1)"
    )
    g.add_argument(
        "--nproc-per-node",
        "--nproc_per_node",
        dest="nproc_per_node",
        type=positive,
        default=1,
        help="ranks per node (default: 1)",
    )
    g.add_argument(
        "--replicas",
        type=positive,
        default=1,
        help="data-parallel replicas the world is split into (default: 1)",
    )
    g.add_argument(
        "--min-replicas",
        type=positive,
        default=replica_config.MIN_REPLICAS,
        metavar="N",
        help="under --recovery replica: fewer healthy replicas than N left and the whole "
        "job restarts from its newest checkpoint; at most --replicas "
        f"(default: {replica_config.MIN_REPLICAS})",
    )
    g.add_argument(
        "--master-addr",
        "--master_addr",
        dest="master_addr",
        default="127.0.0.1",
        help="address of rank 0's store (default: 127.0.0.1)",
    )
    g.add_argument(
        "--master-port",
        "--master_port",
        dest="master_port",
        type=int,
        default=0,
        help="port of rank 0's store; 0 picks a free one per attempt (default: 0)",
    )
    g.add_argument(
        "-m",
        "--module",
        action="store_true",
        help="treat SCRIPT as a Python module name, like python -m",
    )
    g = p.add_argument_group("recovery")
    g.add_argument(
        "--max-restarts",
        "--max_restarts",
        dest="max_restarts",
        type=non_negative,
        default=replica_config.MAX_RESTARTS,
        help="restart budget of the job, or of each replica under --recovery replica "
        f"(default: {replica_config.MAX_RESTARTS})",
    )
    g.add_argument(
        "--recovery",
        choices=("job", "replica", "none"),
        default="job",
        help="what a failed rank costs: 'job' restarts every rank from the last "
        "checkpoint (synchronous baseline); 'replica' drops only the failed rank's replica, "
        "the others train on, and the restarted replica catches up from a healthy peer; "
        "'none' stops the job (default: job)",
    )
    g.add_argument(
        "--snapshots",
        action="store_true",
        help="one snapshot holder per node: the checkpoints the script saves through Eagle "
        "Eye (eagleeye.init().save_checkpoint; under --recovery replica, "
        "ft_runtime.replica.Snapshots) go to memory, are backed up to the next node and "
        "persisted in the run folder; a restart restores from memory, then a peer node, "
        "then storage",
    )
    g.add_argument(
        "--local-agents",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="start one `eagleeye agent` per node on this machine and run the ranks "
        "through them, as `eagleeye controller` does across hosts (the same agent code; "
        "the default); the agents and their ranks die with this command; "
        "--no-local-agents: the ranks are this command's own children",
    )
    add_remediate(g)
    add_metrics(g)
    g = p.add_argument_group("host sources (read on a period, labelled with the hostname)")
    g.add_argument(
        "--gpu-metrics",
        choices=("auto", "off", "nvml"),
        default="auto",
        help="read the host's GPUs through NVML (pynvml): thermal throttles, XIDs and ECC "
        "errors become findings on the rank using the GPU, and the metrics get the GPUs "
        "under dcgm-exporter's names; auto: when pynvml finds a GPU and no --dcgm-url is "
        "given (default: auto)",
    )
    g.add_argument(
        "--dcgm-url",
        default=None,
        metavar="URL",
        help="read this host's GPUs from a dcgm-exporter instead (its /metrics URL)",
    )
    g.add_argument(
        "--kernel-log",
        default=None,
        metavar="FILE",
        help="tail this kernel log (dmesg output, kern.log) for XID lines from the start "
        "of the run",
    )
    g.add_argument(
        "--nccl-dump-dir",
        default=None,
        metavar="DIR",
        help="the ranks' NCCL flight recorders dump here on a timeout "
        "(TORCH_NCCL_DEBUG_INFO_TEMP_FILE); a rank a dump shows behind is a hang finding",
    )
    g.add_argument(
        "--host-metrics",
        action=argparse.BooleanOptionalAction,
        default=True,
        dest="host_counters",
        help="record the host's CPU, memory, disk and NIC counters (default: on)",
    )
    g.add_argument(
        "--sources-period",
        type=seconds,
        default=2.0,
        metavar="S",
        help="how often the host's sources are read (default: 2)",
    )
    add_webhook(
        g,
        "an alert naming this host (dcgm-exporter's Hostname) lands on the job's node "
        "here, or on the rank using its gpu",
    )
    g.add_argument(
        "--telemetry-address",
        default="127.0.0.1",
        metavar="ADDR",
        help="address the ranks' telemetry is received on (ZeroMQ, a free port); every "
        "message must carry the run's HMAC, an unsigned or forged one is dropped and logged "
        "(default: 127.0.0.1)",
    )
    add_tls(g)
    add_policy(g, "the built-in policy of --recovery")
    g.add_argument(
        "--inject",
        action="append",
        default=[],
        metavar="SPEC",
        help="inject a fault, e.g. kill:rank=3@step=40 (repeatable)",
    )
    g.add_argument(
        "--scenario",
        default=None,
        metavar="FILE",
        help="inject the faults listed in FILE (one spec per line, # comments)",
    )
    g.add_argument(
        "--resume-args",
        default="",
        metavar='"ARGS"',
        help="the script's own resume flags, appended to its command on every restart "
        '(e.g. --resume-args "--init_from=resume"); the ranks also get the newest '
        "checkpoint Eagle Eye knows in EAGLEEYE_RESUME_FROM",
    )
    g.add_argument(
        "--grace-period",
        type=seconds,
        default=0.0,
        metavar="S",
        help="on SIGTERM or SIGINT: ask the loops for a checkpoint first and give every "
        "rank S seconds to save and exit before SIGKILL (default: 0, stop at once)",
    )
    add_hang_arguments(p)
    g = p.add_argument_group("console")
    g.add_argument(
        "--stream",
        "--local-ranks-filter",
        dest="stream",
        type=_ranks,
        default=None,
        metavar="RANKS",
        help="ranks whose output is printed with a [rankN]: prefix: all, none, or a comma "
        "list such as 0,3 (default: all; every rank's output is also in its log file)",
    )
    g.add_argument(
        "--no-step-notice",
        type=seconds,
        default=NO_STEP_NOTICE_S,
        metavar="S",
        help="announce the ranks that have sent no step telemetry S seconds into an attempt "
        f"(progress unknown, not a hang; default: {NO_STEP_NOTICE_S:g})",
    )
    g = p.add_argument_group("store")
    g.add_argument(
        "--resume",
        default=None,
        metavar="RUN_DIR",
        help="go on with the run in RUN_DIR (its controller died or it was stopped): the "
        "same job from its store, as the next attempt, from its newest checkpoint",
    )
    g.add_argument(
        "--runs-dir", default="runs", help="directory holding one folder per run (default: ./runs)"
    )
    g.add_argument("--run-id", default=None, help="name of this run (default: generated)")


def _run(args: argparse.Namespace) -> int:
    from eagleeye.console import LiveLog
    from eagleeye.errors import EagleEyeError
    from eagleeye.launch import job_config_from_args, resumed_job_config, run_job

    if args.resume is not None:
        if args.script is not None:
            raise EagleEyeError(
                "--resume takes the script from the run's store; give RUN_DIR, not SCRIPT"
            )
        if args.snapshots:
            raise EagleEyeError(
                "--snapshots cannot change a resumed run: --resume goes on with the settings "
                "in RUN_DIR's store; drop --snapshots"
            )
        config = resumed_job_config(
            args.resume, stream_ranks=args.stream, local_agents=args.local_agents
        )
    elif args.script is None:
        raise EagleEyeError("give the SCRIPT to run (or --resume RUN_DIR)")
    else:
        config = job_config_from_args(args)
    live = LiveLog()
    result = run_job(config, on_update=live)
    stopped = result.report.stopped
    verdict = "succeeded" if result.succeeded else "failed"
    if stopped is not None:
        verdict = f"stopped by {stopped.cause}"
    live.console.print(f"run {verdict}; store: {result.run_dir / 'run.db'}")
    _print_findings(live, result.run_dir)
    if stopped is not None:
        return 128 + stopped.signal  # as a shell reports a process ended by that signal
    return 0 if result.succeeded else 1


#: Findings the end of `eagleeye run` lists at most (the rest: RunReader(...).findings()).
MAX_FINDING_LINES = 20


def _print_findings(live: Any, run_dir: Path) -> None:
    """The run's findings, each with its host and what answered it, from its store."""
    from rich.markup import escape

    from eagleeye.summary import run_finding_lines

    lines = run_finding_lines(str(run_dir))
    if not lines:
        live.console.print("no finding")
        return
    live.console.print(f"{len(lines)} finding(s), each on its host:")
    for line in lines[:MAX_FINDING_LINES]:
        live.console.print(f"  {escape(line.text)}")
    if len(lines) > MAX_FINDING_LINES:
        more = len(lines) - MAX_FINDING_LINES
        live.console.print(f"  +{more} more: eagleeye.store.RunReader({str(run_dir)!r}).findings()")


def _ranks(text: str) -> frozenset[int] | None:
    from eagleeye.rank_output import parse_ranks

    try:
        return parse_ranks(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
