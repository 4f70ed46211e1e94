"""`eagleeye agent`: runs this host's ranks of a job for an `eagleeye controller`
(the help page, ``CLUSTER_DOC``, describes both commands)."""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import socket
import sys
from pathlib import Path
from typing import Any

from eagleeye.commands._args import address_port, non_negative, seconds
from eagleeye.commands._cluster import CLUSTER_DOC, add_common
from eagleeye.commands.hang_flags import add_instrument


def add_parser(sub: Any) -> None:
    a = sub.add_parser(
        "agent",
        help="run this host's ranks of a job for an `eagleeye controller`",
        description=CLUSTER_DOC,
    )
    a.add_argument(
        "--controller", type=address_port, required=True, metavar="HOST:PORT", help="controller"
    )
    add_common(a)
    role = a.add_mutually_exclusive_group(required=True)
    role.add_argument("--node-rank", type=non_negative, help="this host's node rank (0: master)")
    role.add_argument(
        "--spare",
        action="store_true",
        help="join as a spare host: run no ranks until the controller gives this host the "
        "node rank of a host that was lost or evicted",
    )
    a.add_argument(
        "--readmit",
        action="store_true",
        help="with --spare: readmit this host after the controller evicted it from the job "
        "(a fatal XID, an uncorrectable memory error, an evict action); check its hardware "
        "first. Without it, a spare on an evicted host is refused",
    )
    a.add_argument(
        "--advertise",
        default=None,
        metavar="ADDR",
        help="this host's address the other hosts reach (MASTER_ADDR when node rank 0; "
        "default: its hostname)",
    )
    a.add_argument(
        "--holder-port",
        type=non_negative,
        default=0,
        metavar="PORT",
        help="where this host's snapshot holder listens, on the --advertise address, when "
        "the controller runs with --snapshots (default: a free port)",
    )
    a.add_argument(
        "--hostname",
        default=None,
        metavar="NAME",
        help="this host's name as its GPU telemetry names it (dcgm-exporter's Hostname, "
        "which alerts to the controller's webhook carry; default: the hostname)",
    )
    a.add_argument("--log-dir", default="agent-logs", help="where the ranks' output goes")
    a.add_argument(
        "--dcgm-url", default=None, metavar="URL", help="this host's dcgm-exporter /metrics"
    )
    a.add_argument(
        "--kernel-log", default=None, metavar="FILE", help="a kernel log tailed for XIDs"
    )
    a.add_argument(
        "--nccl-dump-dir", default=None, metavar="DIR", help="the ranks' NCCL dumps land here"
    )
    a.add_argument(
        "--gpu-metrics",
        choices=("auto", "off", "nvml"),
        default="auto",
        help="read the GPUs through NVML (auto: when pynvml finds one and no --dcgm-url)",
    )
    a.add_argument(
        "--host-metrics",
        action=argparse.BooleanOptionalAction,
        default=True,
        dest="host_counters",
        help="forward the host's CPU, memory, disk and NIC counters (default: on)",
    )
    a.add_argument(
        "--sources-period", type=seconds, default=2.0, metavar="S", help="read them every S"
    )
    a.add_argument(
        "--grace-period",
        type=seconds,
        default=0.0,
        metavar="S",
        help="on SIGTERM or SIGINT: give the controller S seconds to have every rank "
        "checkpoint and end (default: 0, end this host's ranks at once)",
    )
    a.add_argument(
        "--controller-wait",
        type=seconds,
        default=300.0,
        metavar="S",
        help="a controller that goes away never ends this host's ranks: they train on and "
        "the agent waits for the controller (restarted with the same command line, it adopts "
        "them); once every rank ended and no controller came for S seconds, the agent ends "
        "with status 3 (default: 300)",
    )
    a.add_argument(
        "--local",
        action="store_true",
        help=argparse.SUPPRESS,  # set by `eagleeye run --local-agents` for its own agents:
        # each rank's environment and command line as the controller gives them win over
        # this agent's (its telemetry goes to the run directly); its ranks die with the agent
    )
    add_instrument(a)
    a.add_argument("-m", "--module", action="store_true", help="SCRIPT is a module")
    a.add_argument("script", metavar="SCRIPT")
    a.add_argument("script_args", nargs=argparse.REMAINDER, metavar="...")
    a.set_defaults(func=_agent)


def _agent(args: argparse.Namespace) -> int:
    from eagleeye.agents import AgentLink, read_secret
    from eagleeye.agents.host import HostAgent
    from eagleeye.agents.snapshots import holder_endpoint
    from eagleeye.agents.wire import catchup_token, holder_token, replica_secret
    from eagleeye.errors import EagleEyeError
    from eagleeye.gpus import NCCL_DUMP_ENV, nvml_source
    from eagleeye.hostsources import HostSourcesConfig
    from eagleeye.rerun import BOOT
    from ft_runtime.layout import ENV_CATCHUP_HOST, ENV_CATCHUP_TOKEN
    from ft_runtime.replica.auth import ENV_REPLICA_SECRET

    if args.readmit and not args.spare:
        print(
            "eagleeye agent: --readmit needs --spare (an evicted host comes back as a spare)",
            file=sys.stderr,
        )
        return 2
    secret = read_secret(args.secret_file)
    host, port = args.controller
    hostname = args.hostname or socket.gethostname()
    advertise = args.advertise or socket.gethostname()
    try:
        holder_at = holder_endpoint(advertise, args.holder_port)
    except EagleEyeError as exc:  # needed only with snapshots: the controller says so then
        print(f"eagleeye agent: no snapshot holder: {exc}", file=sys.stderr)
        holder_at = ""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    node_rank = -1 if args.spare else args.node_rank  # a spare's comes with its launch
    link = AgentLink(
        f"tcp://{host}:{port}",
        secret,
        agent=_name(hostname, node_rank, args.spare, args.readmit),
        node_rank=node_rank,
        period_s=args.heartbeat,
        info={
            "address": advertise,
            "visible_devices": visible,
            "holder": holder_at,
            "spare": args.spare,
            "readmit": args.readmit,
        },
        host=hostname,
    ).start()
    script_args = list(args.script_args)
    if script_args[:1] == ["--"]:
        script_args = script_args[1:]
    target = ["-m", args.script] if args.module else [str(Path(args.script).resolve())]
    if args.instrument:  # the zero-code telemetry, as `eagleeye run` starts its ranks
        target = [*BOOT, *target]
    agent = HostAgent(link, node_rank, [*target, *script_args], Path(args.log_dir))
    agent.holder_at, agent.holder_token = holder_at, holder_token(secret)
    agent.replica_env = {  # for the controller's --recovery replica; derived, never sent
        ENV_REPLICA_SECRET: replica_secret(secret),
        ENV_CATCHUP_TOKEN: catchup_token(secret),
        ENV_CATCHUP_HOST: advertise,
    }
    agent.sources = HostSourcesConfig(
        every_s=args.sources_period,
        nvml=nvml_source(args.gpu_metrics, args.dcgm_url),
        dcgm_url=args.dcgm_url,
        kernel_log=args.kernel_log,
        nccl_dump_dir=args.nccl_dump_dir,
        host_counters=args.host_counters,
        visible_devices=visible,
        hostname=hostname,
    )
    if args.nccl_dump_dir is not None:  # every rank's flight recorder dumps there
        folder = Path(args.nccl_dump_dir).resolve()
        folder.mkdir(parents=True, exist_ok=True)
        wanted = {**NCCL_DUMP_ENV, "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": f"{folder}/nccl_trace_rank_"}
        agent.env = {k: v for k, v in wanted.items() if k not in os.environ}

    agent.grace_period_s = args.grace_period
    agent.local = args.local
    agent.controller_wait_s = args.controller_wait
    agent.on_rejoin = lambda line: print(f"eagleeye agent: {line}", file=sys.stderr, flush=True)

    def stop(signum: int, frame: object) -> None:
        agent.stop_requested = signal.Signals(signum).name

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)
    try:
        code = agent.run()
    finally:
        agent.link.close()  # a fenced host's agent that joined again has a new link
    if agent.ended_by is not None:  # fenced, or refused by the controller: one line why
        print(f"eagleeye agent: {agent.ended_by}", file=sys.stderr, flush=True)
    print(json.dumps({"type": "AgentEnded", "code": code}), file=sys.stderr, flush=True)
    return code


def _name(hostname: str, node_rank: int, spare: bool, readmit: bool) -> str:
    """This agent's name in the job: ``HOST-N``, ``HOST-spare``, or for a host readmitted
    after an eviction ``HOST-readmitted-XXXXXX`` (a name never fenced in the job: the
    host's earlier agents were)."""
    if readmit:
        return f"{hostname}-readmitted-{secrets.token_hex(3)}"
    return f"{hostname}-{'spare' if spare else node_rank}"
