"""`eagleeye controller`: the controller of one job across hosts, its agents connecting
to it (the help page, ``CLUSTER_DOC``, describes both commands)."""

from __future__ import annotations

import argparse
import random
import signal
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagleeye.commands._args import address_port, non_negative, positive, seconds
from eagleeye.commands._cluster import CLUSTER_DOC, add_common, show
from eagleeye.commands.hang_flags import (
    CLUSTER_HANGS,
    CLUSTER_LIMITS,
    add_hang_arguments,
    hang_limits,
)
from eagleeye.commands.service_flags import (
    add_metrics,
    add_policy,
    add_remediate,
    add_tls,
    add_webhook,
    webhook_of,
)
from eagleeye.errors import EagleEyeError

if TYPE_CHECKING:
    from pathlib import Path

    from eagleeye.agents import Membership
    from eagleeye.agents.coordinator import JobCoordinator
    from eagleeye.agents.places import AgentPlaces
    from eagleeye.agents.replicas import ReplicaCoordinator
    from eagleeye.runalerts import RunAlerts
    from eagleeye.runmetrics import RunMetrics
    from eagleeye.store import RunStore
    from eagleeye.tls import TlsFiles
    from ft_runtime.layout import JobLayout
    from remediation import Policy


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
    c.add_argument(
        "--recovery",
        choices=("job", "replica"),
        default="job",
        help="job (default): a failure restarts the job on every host; replica: the job is "
        "--replicas data-parallel replicas (ranks through the replica library) and a failed "
        "rank, a lost host or an evicted one costs only its replicas, restarted (on a spare "
        "host for a lost or evicted one) and caught up from a healthy replica while the "
        "others train on",
    )
    c.add_argument(
        "--replicas",
        type=positive,
        default=1,
        help="with --recovery replica: replicas the world is split into (default: 1)",
    )
    c.add_argument(
        "--max-restarts",
        type=non_negative,
        default=3,
        help="restart budget (with --recovery replica: of each replica)",
    )
    c.add_argument(
        "--join-timeout", type=seconds, default=300.0, metavar="S", help="wait for agents"
    )
    c.add_argument(
        "--grace-period",
        type=seconds,
        default=0.0,
        metavar="S",
        help="on SIGTERM or SIGINT (to the controller or an agent): ask the loops (with "
        "--recovery replica, the replicas) for a checkpoint first and give every rank S "
        "seconds to save and exit before SIGKILL (default: 0, stop at once)",
    )
    c.add_argument(
        "--snapshots",
        action="store_true",
        help="checkpoints go to memory: each agent runs its host's snapshot holder, backing "
        "up to the next host's (ranks that save through eagleeye.init())",
    )
    c.add_argument("--runs-dir", default="runs", help="folder of run folders (default: runs)")
    c.add_argument(
        "--run-id",
        default=None,
        help="name of this run (default: generated). A controller started again with the "
        "same --runs-dir and --run-id (the same command line) goes on with the unfinished "
        "run: it reopens its store and adopts the agents' running ranks",
    )
    g = c.add_argument_group("remediation, metrics and alerts (as `eagleeye run`)")
    add_remediate(g)
    add_policy(
        g,
        "the built-in cluster policy: a failed or hung rank restarts the job on every host "
        "(with --recovery replica: its replica), a critical XID or an uncorrectable memory "
        "error evicts its host (with no spare host, the job stops; with --recovery replica "
        "its replicas end and the others go on)",
    )
    add_metrics(g)
    add_webhook(
        g,
        "an alert naming an agent's host (dcgm-exporter's Hostname) lands on that host's "
        "node, or on the rank using its gpu; one naming a host no agent runs on is "
        "recorded and not acted on",
    )
    add_tls(g)
    add_hang_arguments(c, CLUSTER_LIMITS, instrument=False, about=CLUSTER_HANGS)
    c.add_argument(
        "--stacks-wait",
        type=seconds,
        default=None,
        metavar="S",
        help="with --recovery job, the longest a hang's action waits for every host's "
        "stacks of its ranks (a host that has not answered by then has its ranks recorded "
        "without stacks; 0: none are asked for) (default: 5)",
    )
    c.set_defaults(func=_controller)


def _controller(args: argparse.Namespace) -> int:
    """Whatever is wrong with the flags (a policy file, a port, a token file) fails here,
    before the agents' socket is bound or a run folder made."""
    from eagleeye.store import new_run_id
    from eagleeye.tls import tls_files
    from ft_runtime.layout import JobLayout
    from remediation import cluster_replica_policy, cluster_restart_policy, load_policy

    replica = args.recovery == "replica"
    if replica and args.snapshots:
        raise EagleEyeError(
            "--recovery replica does not take --snapshots yet; leave it out, or use --recovery job"
        )
    if args.replicas > 1 and not replica:
        raise EagleEyeError("--replicas needs --recovery replica")
    if args.policy is not None:
        policy = load_policy(args.policy)
    else:
        policy = cluster_replica_policy() if replica else cluster_restart_policy()
    tls = tls_files(args.tls_cert, args.tls_key)
    with ExitStack() as cleanup:
        run_id = args.run_id or new_run_id()
        layout = JobLayout(args.nnodes, args.nproc_per_node, args.replicas)
        metrics = None
        if args.metrics_port is not None:
            from eagleeye.runmetrics import RunMetrics

            metrics = RunMetrics.open(
                run_id,
                layout,
                args.metrics_port,
                args.metrics_address,
                linger_s=args.metrics_linger,
                tls=tls,
            )
            cleanup.callback(metrics.close)
        alerts = _alerts(args, tls)
        if alerts is not None:
            cleanup.callback(alerts.close)
        return _coordinate(args, run_id, layout, policy, metrics, alerts)


def _alerts(args: argparse.Namespace, tls: TlsFiles | None) -> RunAlerts | None:
    """Alertmanager's webhook, bound (started once the agents' hosts can place alerts)."""
    address, port = webhook_of(args)
    if port is None:
        return None
    if not args.alerts_token_file:
        raise EagleEyeError(
            "--webhook needs --webhook-token-file, the file with the token Alertmanager "
            "sends (eagleeye alerts alertmanager --token-file)"
        )
    from eagleeye.runalerts import RunAlerts

    return RunAlerts(args.alerts_token_file, port, address, None if tls is None else tls.context())


def _coordinate(
    args: argparse.Namespace,
    run_id: str,
    layout: JobLayout,
    policy: Policy,
    metrics: RunMetrics | None,
    alerts: RunAlerts | None,
) -> int:
    from eagleeye.agents import Membership, read_secret
    from eagleeye.agents import resume as journal
    from eagleeye.agents.coordinator import JobCoordinator
    from eagleeye.agents.hangstacks import STACK_WAIT_S
    from eagleeye.agents.places import AgentPlaces
    from eagleeye.store import DB_NAME, RunStore, create_run_dir
    from ft_runtime.types import Phase

    secret = read_secret(args.secret_file)
    config = {
        "nnodes": args.nnodes,
        "nproc_per_node": args.nproc_per_node,
        "recovery": args.recovery,
        "replicas": args.replicas,
        "snapshots": args.snapshots,
        "remediate": args.remediate,
        "max_restarts": args.max_restarts,
        "policy": policy.name,
        "policy_file": args.policy,
        "grace_period_s": args.grace_period,
    }
    run_dir = Path(args.runs_dir) / run_id
    again = args.run_id is not None and (run_dir / DB_NAME).exists()
    state = journal.load(run_dir, config) if again else None  # refused here: nothing bound
    host, port = args.listen
    members = Membership(secret, f"tcp://{host}:{port}", period_s=args.heartbeat)
    if not again:
        run_dir = create_run_dir(args.runs_dir, run_id)
    store = RunStore(run_dir)
    store.set_meta("run_id", run_id)
    store.set_meta("config", config)
    if args.recovery == "replica":
        return _replicas(
            args, run_id, layout, policy, members, store, run_dir, metrics, alerts, state
        )
    places = AgentPlaces(layout)
    ports = random.Random()
    coordinator = JobCoordinator(
        members,
        layout,
        store,
        max_restarts=args.max_restarts,
        master_port=lambda attempt: ports.randint(20000, 29000),
        on_update=show if metrics is None else _also_export(metrics),
        grace_s=args.grace_period,
        snapshots=args.snapshots,
        policy=policy,
        dry_run=False if args.remediate else None,  # else the policy's: a dry run
        inbox=None if alerts is None else alerts.take,
        on_samples=(lambda samples: None) if metrics is None else metrics.host_samples,
        on_job_frame=(lambda frame: None) if metrics is None else metrics.job_step,
        on_joined=places.admit,
        journal=lambda job: journal.save(store, job),
        hang=hang_limits(args),
        stack_wait_s=STACK_WAIT_S if args.stacks_wait is None else args.stacks_wait,
    )
    if state is not None:
        journal.restore(coordinator, state)
    _serve(coordinator, metrics, alerts, places)
    show(
        {
            "listening": members.address,
            "run_dir": str(run_dir),
            "metrics": None if metrics is None else metrics.url,
            "webhook": None if alerts is None else alerts.url,
            "remediate": args.remediate,
            "policy": policy.name,
            "resumed": None if state is None else {"attempt": coordinator.attempt},
        }
    )
    started = time.time()
    try:
        phase = coordinator.run(join_timeout_s=args.join_timeout)
        attempts = coordinator.attempt + 1
        store.set_meta("result", _result(phase is Phase.SUCCEEDED, started, attempts))
    finally:
        members.poll(timeout_s=0.5)  # the agents' last outcomes
        store.close()
        members.close()
    return 0 if phase is Phase.SUCCEEDED else 1


def _replicas(
    args: argparse.Namespace,
    run_id: str,
    layout: JobLayout,
    policy: Policy,
    members: Membership,
    store: RunStore,
    run_dir: Path,
    metrics: RunMetrics | None,
    alerts: RunAlerts | None,
    state: dict[str, Any] | None,
) -> int:
    """``--recovery replica``: the quorum's store in a process of its own on the listen
    address's host, its secret derived from the job's (``eagleeye.agents.replicas``);
    ``state``: the journal of the run this controller goes on with
    (``eagleeye.agents.replicaresume``)."""
    from eagleeye.agents import replicaresume
    from eagleeye.agents.places import AgentPlaces
    from eagleeye.agents.replicas import ReplicaCoordinator
    from eagleeye.agents.wire import replica_secret
    from ft_runtime.types import Phase

    places = AgentPlaces(layout)
    coordinator = ReplicaCoordinator(
        members,
        layout,
        store,
        replica_secret(members.secret),
        store_host=args.listen[0],
        run_id=run_id,
        log_dir=run_dir / "replicas",
        max_restarts=args.max_restarts,
        policy=policy,
        dry_run=False if args.remediate else None,
        on_update=show if metrics is None else _also_export(metrics),
        grace_s=args.grace_period,
        inbox=None if alerts is None else alerts.take,
        on_samples=(lambda samples: None) if metrics is None else metrics.host_samples,
        on_job_frame=(lambda frame: None) if metrics is None else metrics.job_step,
        on_joined=places.admit,
    )
    if state is not None:
        try:
            replicaresume.restore(coordinator, state)
        except EagleEyeError:
            store.close()
            members.close()
            raise
    _serve(coordinator, metrics, alerts, places)
    supervisor = coordinator.supervisor
    show(
        {
            "listening": members.address,
            "run_dir": str(run_dir),
            "metrics": None if metrics is None else metrics.url,
            "webhook": None if alerts is None else alerts.url,
            "recovery": "replica",
            "remediate": args.remediate,
            "policy": policy.name,
            "resumed": None
            if supervisor is None
            else {
                "attempt": supervisor.attempt,
                "epoch": supervisor.quorum.current.epoch,
                "incarnations": supervisor.incarnation,
            },
        }
    )
    started = time.time()
    try:
        phase = coordinator.run(join_timeout_s=args.join_timeout)
        attempts = 1 if coordinator.supervisor is None else coordinator.supervisor.attempt + 1
        store.set_meta("result", _result(phase is Phase.SUCCEEDED, started, attempts))
    finally:
        members.poll(timeout_s=0.5)  # the agents' last outcomes
        store.close()
        members.close()
    return 0 if phase is Phase.SUCCEEDED else 1


def _result(succeeded: bool, started: float, attempts: int) -> dict[str, object]:
    """The run's result in its store, as `eagleeye run` records it (`eagleeye summary`)."""
    return {"succeeded": succeeded, "started": started, "ended": time.time(), "attempts": attempts}


def _serve(
    coordinator: JobCoordinator | ReplicaCoordinator,
    metrics: RunMetrics | None,
    alerts: RunAlerts | None,
    places: AgentPlaces,
) -> None:
    """What both coordinators are wired to before they run: the exporter's view of the
    pending actions, a stop on SIGTERM or SIGINT, the webhook placing alerts on the
    agents' hosts."""
    if metrics is not None:
        metrics.remediator = coordinator.remediator
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda s, f: coordinator.request_stop(signal.Signals(s).name))
    if alerts is not None:
        alerts.locate = places.locate
        alerts.start()


def _also_export(metrics: RunMetrics) -> Callable[[object], None]:
    def update(item: object) -> None:
        metrics.update(item)
        show(item)

    return update
