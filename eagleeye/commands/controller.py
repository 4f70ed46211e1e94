"""`eagleeye controller`: the controller of one job across hosts, its agents connecting
to it (the help page, ``CLUSTER_DOC``, describes both commands)."""

from __future__ import annotations

import argparse
import random
import signal
from typing import Any

from eagleeye.commands._args import address_port, non_negative, positive, seconds
from eagleeye.commands._cluster import CLUSTER_DOC, add_common, show


def add_parser(sub: Any) -> None:
    c = sub.add_parser(
        "controller",
        help="the controller of a job across hosts (agents connect to it)",
        description=CLUSTER_DOC,
    )
    c.add_argument(
        "--listen",
        type=address_port,
        default=("127.0.0.1", 29400),
        metavar="ADDR:PORT",
        help="where the agents connect (default: 127.0.0.1:29400; give this host's "
        "address for agents on other hosts)",
    )
    add_common(c)
    c.add_argument("--nnodes", type=positive, required=True, help="hosts (one agent each)")
    c.add_argument("--nproc-per-node", type=positive, default=1, help="ranks per host")
    c.add_argument("--max-restarts", type=non_negative, default=3, help="restart budget")
    c.add_argument(
        "--join-timeout", type=seconds, default=300.0, metavar="S", help="wait for agents"
    )
    c.add_argument(
        "--grace-period",
        type=seconds,
        default=0.0,
        metavar="S",
        help="on SIGTERM or SIGINT (to the controller or an agent): ask the loops for a "
        "checkpoint first and give every rank S seconds to save and exit before SIGKILL "
        "(default: 0, stop at once)",
    )
    c.add_argument(
        "--snapshots",
        action="store_true",
        help="checkpoints go to memory: each agent runs its host's snapshot holder, backing "
        "up to the next host's (ranks that save through eagleeye.init())",
    )
    c.add_argument("--runs-dir", default="runs", help="folder of run folders (default: runs)")
    c.add_argument("--run-id", default=None, help="name of this run (default: generated)")
    c.set_defaults(func=_controller)


def _controller(args: argparse.Namespace) -> int:
    from eagleeye.agents import Membership, read_secret
    from eagleeye.agents.coordinator import JobCoordinator
    from eagleeye.store import RunStore, create_run_dir, new_run_id
    from ft_runtime.layout import JobLayout
    from ft_runtime.types import Phase

    secret = read_secret(args.secret_file)
    host, port = args.listen
    members = Membership(secret, f"tcp://{host}:{port}", period_s=args.heartbeat)
    run_id = args.run_id or new_run_id()
    run_dir = create_run_dir(args.runs_dir, run_id)
    store = RunStore(run_dir)
    layout = JobLayout(args.nnodes, args.nproc_per_node)
    store.set_meta("run_id", run_id)
    store.set_meta(
        "config",
        {
            "nnodes": args.nnodes,
            "nproc_per_node": args.nproc_per_node,
            "recovery": "job",
            "snapshots": args.snapshots,
        },
    )
    ports = random.Random()
    coordinator = JobCoordinator(
        members,
        layout,
        store,
        max_restarts=args.max_restarts,
        master_port=lambda attempt: ports.randint(20000, 29000),
        on_update=show,
        grace_s=args.grace_period,
        snapshots=args.snapshots,
    )
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda s, f: coordinator.request_stop(signal.Signals(s).name))
    show({"listening": members.address, "run_dir": str(run_dir)})
    try:
        phase = coordinator.run(join_timeout_s=args.join_timeout)
        store.set_meta("result", {"succeeded": phase is Phase.SUCCEEDED})
    finally:
        members.poll(timeout_s=0.5)  # the agents' last outcomes
        store.close()
        members.close()
    return 0 if phase is Phase.SUCCEEDED else 1
