"""`eagleeye run` as a library call: set up a run folder, launch, supervise, record."""

from __future__ import annotations

import argparse
import importlib.util
import logging
import math
import os
import secrets
import shlex
import shutil
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from dataclasses import fields as dataclass_fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collector.transport import TelemetryReceiver
from detectors.config import CONFIG_ENV, DEFAULT_SPECS, DetectorsConfig, load_config
from detectors.progress import NO_STEP_NOTICE_S, HangLimits, ProgressStall
from eagleeye.commands.service_flags import webhook_of
from eagleeye.config import ENV_CHECKPOINT_DIR, ENV_RUN_DIR, ENV_TELEMETRY, ENV_TELEMETRY_KEY
from eagleeye.controller import Controller, ControllerReport, StopRequest
from eagleeye.detection import host_detectors, live_config, live_detectors
from eagleeye.errors import EagleEyeError
from eagleeye.gpus import NCCL_DUMP_ENV, NvmlFactory, nvml_source
from eagleeye.hostsources import HostPlaces, HostSources, HostSourcesConfig
from eagleeye.injector import FaultFired, OutsideInjector
from eagleeye.rank_output import RankOutput
from eagleeye.rerun import StoredRun, layout_of, read_stored_run, target_of
from eagleeye.runalerts import RunAlerts
from eagleeye.runmetrics import RunMetrics
from eagleeye.snapshots import Holders
from eagleeye.stacks import StackCapture
from eagleeye.store import RunStore, StoreMembershipLog, create_run_dir, new_run_id
from eagleeye.tls import TlsFiles, tls_files
from ft_runtime.base import Supervisor
from ft_runtime.faults import ENV_INJECT, FaultSpec, load_scenario, parse_specs
from ft_runtime.launcher import Launcher
from ft_runtime.layout import ENV_CATCHUP_TOKEN, ENV_RESUME_FROM, ENV_SERVE_NICE, JobLayout
from ft_runtime.replica import config as replica_config
from ft_runtime.supervisor import JobSupervisor, LaunchSpec
from ft_runtime.types import LifecycleEvent, Phase
from remediation.config import load_policy
from remediation.policy import Policy, replica_restart_policy, synchronous_restart_policy
from remediation.remediator import Remediator

if TYPE_CHECKING:
    from eagleeye.agents.local import LocalAgents

log = logging.getLogger(__name__)

RECOVERIES = ("job", "replica", "none")


@dataclass(frozen=True, slots=True)
class JobConfig:
    """Everything `eagleeye run` needs; built from flags or by the demo."""

    script: str
    script_args: Sequence[str] = ()
    module: bool = False
    layout: JobLayout = field(default_factory=JobLayout)
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    max_restarts: int = replica_config.MAX_RESTARTS
    recovery: str = "job"
    remediate: bool = False
    inject: Sequence[str] = ()
    runs_dir: str = "runs"
    run_id: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    hang: Mapping[str, float] = field(default_factory=dict)  # HangLimits set by flags
    instrument: bool = True  # zero-code telemetry (eagleeye.boot) in every rank
    no_step_notice_s: float = NO_STEP_NOTICE_S  # ranks with no step this far in: announced
    # replica recovery (ft_runtime.replica.config: its defaults, without torch)
    stall_factor: float = replica_config.STALL_FACTOR
    stall_floor_s: float = replica_config.STALL_FLOOR_S
    lateness_factor: float = replica_config.LATENESS_FACTOR
    min_replicas: int = replica_config.MIN_REPLICAS
    joiner_nice: int = replica_config.JOINER_NICE
    serve_nice: int = replica_config.SERVE_NICE
    straggler_factor: float = replica_config.STRAGGLER_FACTOR
    max_job_restarts: int = replica_config.MAX_JOB_RESTARTS
    command_timeout_s: float = replica_config.COMMAND_TIMEOUT_S
    policy: str | None = None
    metrics_port: int | None = None  # serve Prometheus metrics (0: a free port)
    metrics_address: str = "127.0.0.1"
    metrics_linger_s: float = 0.0  # the final state stays scrapable this long after the run
    gpu_metrics: NvmlFactory | None = None  # each node's NVML module, when GPUs are polled
    # False: NVML's readings are only exported (Prometheus's rules alert on them), not read
    # by the host rules of the run
    gpu_findings: bool = True
    dcgm_url: str | None = None  # a dcgm-exporter on this host, read by the host's sources
    kernel_log: str | None = None  # a kernel-log file tailed for XID lines
    nccl_dump_dir: str | None = None  # where the ranks' NCCL flight-recorder dumps land
    host_counters: bool = False  # CPU, memory, disk and NIC counters of the host
    sources_period_s: float = 2.0  # how often the host's sources are read
    alerts_port: int | None = None  # Alertmanager's webhook into this run (0: a free port)
    alerts_address: str = "127.0.0.1"
    alerts_token_file: str | None = None  # the bearer token Alertmanager sends
    tls: TlsFiles | None = None  # the metrics and the webhook over HTTPS
    telemetry_address: str = "127.0.0.1"  # where the ranks' telemetry is received
    snapshots: bool = False  # one snapshot holder per node; checkpoints go to memory
    resume_args: Sequence[str] = ()  # the script's own resume flags, added on restarts
    grace_period_s: float = 0.0  # on SIGTERM/SIGINT: checkpoint, then this long to exit
    stream_ranks: Collection[int] | None = ()  # ranks whose output is printed (None: all)
    resume_dir: str | None = None  # go on with this run (eagleeye run --resume)
    local_agents: bool = True  # the ranks started by an `eagleeye agent` per node, here

    def __post_init__(self) -> None:
        if self.recovery not in RECOVERIES:
            raise EagleEyeError(
                f"unknown recovery {self.recovery!r}; use one of {', '.join(RECOVERIES)}"
            )
        if not 1 <= self.min_replicas <= self.layout.replicas:
            raise EagleEyeError(
                f"--min-replicas {self.min_replicas} is not between 1 and the job's "
                f"{self.layout.replicas} replicas (--replicas); give a count in that range"
            )
        for spec in parse_specs(self.inject):  # a bad spec fails here, before any launch
            self._check_fault(spec)
        if not math.isfinite(self.grace_period_s) or self.grace_period_s < 0:
            raise EagleEyeError(
                f"--grace-period {self.grace_period_s} is not a number of seconds >= 0"
            )
        if not math.isfinite(self.no_step_notice_s) or self.no_step_notice_s <= 0:
            raise EagleEyeError(
                f"--no-step-notice {self.no_step_notice_s} is not a number of seconds above 0"
            )

    def _check_fault(self, spec: FaultSpec) -> None:
        """A fault that can never fire is an error before the launch."""
        if spec.rank >= self.layout.world_size:
            raise EagleEyeError(
                f"fault {spec} names rank {spec.rank}, but the job has "
                f"{self.layout.world_size} ranks"
            )
        if spec.attempt > self.max_restarts:
            raise EagleEyeError(
                f"fault {spec} is for attempt {spec.attempt}, but the job has at most "
                f"{self.max_restarts} restarts (--max-restarts); it could never fire"
            )
        if not spec.outside and not self.instrument and self.recovery != "replica":
            log.info("fault %s fires only if the script calls ee.faults.fire(step)", spec)

    def command(self) -> list[str]:
        """The rank's command line after the interpreter; through the zero-code boot
        unless ``instrument`` is off."""
        target = self._target()
        return ["-m", "eagleeye.boot", *target] if self.instrument else target

    def _target(self) -> list[str]:
        if self.module:
            if importlib.util.find_spec(self.script) is None:
                raise EagleEyeError(
                    f"module {self.script!r} not found; check the name or drop -m to run a file"
                )
            return ["-m", self.script, *self.script_args]
        if not Path(self.script).is_file():
            raise EagleEyeError(
                f"script {self.script!r} not found; pass a Python file or -m MODULE"
            )
        return [str(Path(self.script).resolve()), *self.script_args]


@dataclass(frozen=True, slots=True)
class JobResult:
    run_dir: Path
    report: ControllerReport

    @property
    def succeeded(self) -> bool:
        return self.report.succeeded


def job_config_from_args(args: argparse.Namespace) -> JobConfig:
    script_args = list(args.script_args)
    if script_args[:1] == ["--"]:
        script_args = script_args[1:]
    return JobConfig(
        script=args.script,
        script_args=script_args,
        module=args.module,
        layout=JobLayout(args.nnodes, args.nproc_per_node, args.replicas),
        min_replicas=args.min_replicas,
        master_addr=args.master_addr,
        master_port=args.master_port,
        max_restarts=args.max_restarts,
        recovery=args.recovery,
        remediate=args.remediate,
        inject=[*args.inject, *(load_scenario(args.scenario) if args.scenario else [])],
        runs_dir=args.runs_dir,
        run_id=args.run_id,
        policy=args.policy,
        metrics_port=args.metrics_port,
        metrics_address=getattr(args, "metrics_address", "127.0.0.1"),
        metrics_linger_s=getattr(args, "metrics_linger", 0.0),
        gpu_metrics=nvml_source(
            getattr(args, "gpu_metrics", "off"), getattr(args, "dcgm_url", None)
        ),
        dcgm_url=getattr(args, "dcgm_url", None),
        kernel_log=getattr(args, "kernel_log", None),
        nccl_dump_dir=getattr(args, "nccl_dump_dir", None),
        host_counters=getattr(args, "host_counters", False),
        sources_period_s=getattr(args, "sources_period", 2.0),
        alerts_port=webhook_of(args)[1],
        alerts_address=webhook_of(args)[0],
        alerts_token_file=getattr(args, "alerts_token_file", None),
        tls=tls_files(getattr(args, "tls_cert", None), getattr(args, "tls_key", None)),
        telemetry_address=getattr(args, "telemetry_address", "127.0.0.1"),
        hang=hang_flags(args),
        instrument=getattr(args, "instrument", True),
        no_step_notice_s=getattr(args, "no_step_notice", NO_STEP_NOTICE_S),
        resume_args=_split_args(getattr(args, "resume_args", "")),
        grace_period_s=getattr(args, "grace_period", 0.0),
        stream_ranks=getattr(args, "stream", None),
        snapshots=getattr(args, "snapshots", False),
        local_agents=getattr(args, "local_agents", True),
    )


def _split_args(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError as exc:
        raise EagleEyeError(
            f"--resume-args {text!r} cannot be split into arguments: {exc}"
        ) from None


def hang_flags(args: argparse.Namespace) -> dict[str, float]:
    """The hang limits given as ``--hang-*`` flags (dest ``hang_<limit>``), by limit."""
    given = {name: getattr(args, f"hang_{name}", None) for name in _limit_names()}
    return {name: value for name, value in given.items() if value is not None}


def _limit_names() -> list[str]:
    return [f.name for f in dataclass_fields(HangLimits)]


def policy_for(config: JobConfig) -> Policy:
    """The policy file given, else the built-in policy of the recovery mode."""
    if config.policy is not None:
        return load_policy(config.policy)
    if config.recovery == "none":
        return Policy(rules=(), name="none (failures stop the job)")
    if config.recovery == "replica":
        return replica_restart_policy()
    return synchronous_restart_policy()


def supervisor_for(
    config: JobConfig,
    launch: LaunchSpec,
    store: RunStore | None = None,
    launcher: Launcher | None = None,
) -> Supervisor:
    """The synchronous baseline, or replicas as the unit of failure. With a run store, the
    quorum coordinator records its memberships there and can restart from them. The ranks
    run through ``launcher`` (default: child processes of this one)."""
    if config.recovery != "replica":
        return JobSupervisor(launch, max_restarts=config.max_restarts, launcher=launcher)
    # The quorum hosts a torch TCPStore: torch is imported only when replicas need it.
    from ft_runtime.quorum import QuorumService
    from ft_runtime.replica import ReplicaSupervisor

    quorum = QuorumService(
        config.layout.replicas,
        config.layout.replica_size,
        host=config.master_addr,
        min_replicas=config.min_replicas,
        stall_factor=config.stall_factor,
        stall_floor_s=config.stall_floor_s,
        lateness_factor=config.lateness_factor,
        # a resumed run starts a new quorum: the store its records name is gone
        log=None if store is None else StoreMembershipLog(store, fresh=bool(config.resume_dir)),
    )
    return ReplicaSupervisor(
        launch,
        quorum,
        max_restarts=config.max_restarts,
        max_job_restarts=config.max_job_restarts,
        command_timeout_s=config.command_timeout_s,
        joiner_nice=config.joiner_nice,
        straggler_factor=config.straggler_factor,
        launcher=launcher,
    )


def _hold_is_no_hang(supervisor: Supervisor, controller: Controller) -> None:
    """A replica supervisor learns which ranks an injected slow fault holds stopped right
    now: their stopped state is no evidence of a hang."""
    # the supervisor's module, not the package (which job mode imports for its config):
    # asking the package for ReplicaSupervisor would import torch into the controller
    if controller.injector is None or "ft_runtime.replica.supervisor" not in sys.modules:
        return
    from ft_runtime.replica import ReplicaSupervisor

    if isinstance(supervisor, ReplicaSupervisor):
        supervisor.held = controller.injector.held


@dataclass(frozen=True, slots=True)
class RunStarted:
    """A run's folder exists and its ranks are about to start (for the console)."""

    run_dir: Path
    logs: Path


@dataclass(frozen=True, slots=True)
class UnfiredFaults:
    """Faults of the run that never fired (reported at its end)."""

    specs: tuple[FaultSpec, ...]


def run_job(config: JobConfig, on_update: Callable[[object], None] | None = None) -> JobResult:
    """Runs a job to its end (success, failure, spent restart budget, or a stop signal).
    Whatever fails before the launch fails before a run folder is made."""
    command = config.command()
    refuse_replica_without_api(config)
    refuse_snapshots_without_api(config)
    limits, fused = detector_config(config.hang)  # a bad config file fails before any launch
    policy = policy_for(config)
    stored = None if config.resume_dir is None else read_stored_run(config.resume_dir)
    run_id = stored.run_id if stored is not None else config.run_id or new_run_id()
    with ExitStack() as cleanup:
        metrics = _metrics(config, run_id)  # a busy port fails here, before the run folder
        if metrics is not None:
            cleanup.callback(metrics.close)  # after lingering, when asked to
        alerts = _alerts(config, metrics)
        if alerts is not None:
            cleanup.callback(alerts.close)
        if stored is not None:
            return _run_in(
                stored.run_dir, run_id, config, command, limits, fused, policy, on_update,
                metrics, alerts, stored,
            )  # fmt: skip
        run_dir = create_run_dir(config.runs_dir, run_id)
        try:
            return _run_in(
                run_dir, run_id, config, command, limits, fused, policy, on_update, metrics, alerts
            )
        except BaseException:
            if not any((run_dir / "logs").iterdir()):  # nothing launched: leave no run
                shutil.rmtree(run_dir, ignore_errors=True)
            raise


def _run_in(
    run_dir: Path,
    run_id: str,
    config: JobConfig,
    command: list[str],
    limits: HangLimits,
    fused: DetectorsConfig | None,
    policy: Policy,
    on_update: Callable[[object], None] | None,
    metrics: RunMetrics | None,
    alerts: RunAlerts | None,
    stored: StoredRun | None = None,
) -> JobResult:
    store = RunStore(run_dir)
    telemetry_key = secrets.token_hex(32)  # ranks sign telemetry; unsigned is dropped
    receiver = TelemetryReceiver(f"tcp://{config.telemetry_address}", key=telemetry_key.encode())
    env = {
        **config.env,
        ENV_TELEMETRY: receiver.address,
        ENV_TELEMETRY_KEY: telemetry_key,
        ENV_RUN_DIR: str(run_dir.resolve()),
        ENV_CHECKPOINT_DIR: str((run_dir / "checkpoints").resolve()),
        ENV_INJECT: ";".join(config.inject),
    }
    env.setdefault("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    # A source's catch-up server runs below its training thread (0: at the same priority).
    env.setdefault(ENV_SERVE_NICE, str(config.serve_nice))
    # Peers serve their state to each other only with this run's token.
    env.setdefault(ENV_CATCHUP_TOKEN, secrets.token_hex(16))
    holders = _holders(config, run_id, run_dir)
    env.update(holders.env if holders is not None else {})
    env.update(_nccl_dump_env(config, env))
    sources = _host_sources(config, env)
    launch = LaunchSpec(
        command,
        config.layout,
        run_id,
        str(run_dir / "logs"),
        config.master_addr,
        config.master_port,
        env,
        resume_args=tuple(config.resume_args),
    )
    # every (virtual) node runs on this host: where the summary places each finding
    hostname = sources.hostname if sources is not None else socket.gethostname()
    show = on_update or (lambda item: None)
    agents = _local_agents(config, run_dir, command, hostname, store, show, lambda: supervisor)
    supervisor = supervisor_for(config, launch, store, agents)
    store.set_meta("run_id", run_id)
    store.set_meta(
        "config",
        {
            "command": command,
            "nnodes": config.layout.nnodes,
            "nproc_per_node": config.layout.nproc_per_node,
            "replicas": config.layout.replicas,
            "min_replicas": config.min_replicas,
            "recovery": config.recovery,
            "remediate": config.remediate,
            "inject": list(config.inject),
            "max_restarts": config.max_restarts,
            "policy": policy.name,
            "policy_file": config.policy,
            "snapshots": config.snapshots,
            "instrument": config.instrument,
            "hang": asdict(limits),
            "no_step_notice_s": config.no_step_notice_s,
            "resume_args": list(config.resume_args),
            "grace_period_s": config.grace_period_s,
            "local_agents": config.local_agents,
        },
    )
    store.set_meta("hosts", {spec.node: hostname for spec in config.layout.ranks()})
    detectors = live_detectors(limits, fused)
    # --remediate enables actions; without it the policy decides (files default to dry-run).
    remediator = Remediator(policy, supervisor, dry_run=False if config.remediate else None)
    if metrics is not None:
        metrics.remediator = remediator
        metrics.watch(detectors)
        if sources is not None and sources.config.nvml is not None:
            metrics.gpu_of = sources.gpu_of
    controller = Controller(
        supervisor,
        receiver,
        store,
        detectors,
        remediator,
        on_update=show if metrics is None else _also_export(metrics, show),
        on_samples=(lambda samples: None) if metrics is None else metrics.samples,
        stacks=StackCapture(run_dir),
        progress=next((d for d in detectors if isinstance(d, ProgressStall)), None),
        unknown_after_s=config.no_step_notice_s,
        injector=OutsideInjector(
            parse_specs(config.inject), supervisor.pids, _record_fault(store, show)
        ),
        run_dir=run_dir,
        inbox=None if alerts is None else alerts.take,
        host=None if sources is None else sources.take,
        host_detectors=host_detectors() if sources is not None else (),
    )
    supervisor.attempt_env = resume_env(controller)
    _hold_is_no_hang(supervisor, controller)
    if stored is not None:
        _continue(stored, supervisor, controller, store)
    output = RankOutput(run_dir / "logs", config.stream_ranks, skip_existing=stored is not None)
    show(RunStarted(run_dir, run_dir / "logs"))
    try:
        with (
            _stop_on_signals(controller, config.grace_period_s),
            output,
            holders if holders is not None else nullcontext(),
            sources if sources is not None else nullcontext(),
            _polling(metrics, sources),
            agents if agents is not None else nullcontext(),
        ):
            report = controller.run()
        unfired = tuple(controller.injector.unfired()) if controller.injector else ()
        if unfired:
            store.set_meta("faults_unfired", [str(spec) for spec in unfired])
            show(UnfiredFaults(unfired))
        store.set_meta(
            "result",
            {
                "succeeded": report.succeeded,
                "started": report.started,
                "ended": report.ended,
                "attempts": supervisor.attempt + 1,
                "stopped_by": None if report.stopped is None else report.stopped.cause,
            },
        )
    finally:
        receiver.close()
        store.close()
    return JobResult(run_dir, report)


def _local_agents(
    config: JobConfig,
    run_dir: Path,
    command: Sequence[str],
    hostname: str,
    store: RunStore,
    show: Callable[[object], None],
    supervisor: Callable[[], Supervisor],
) -> LocalAgents | None:
    """With ``local_agents``: an agent per node on this machine, the supervisor's launcher
    (started by the caller); each agent's join and each rank's launch recorded with its
    agent and host."""
    if not config.local_agents:
        return None
    from eagleeye.agents.local import LocalAgents

    def record(subject: str, phase: Phase, detail: dict[str, object]) -> None:
        attempt = max(supervisor().attempt, 0)
        event = LifecycleEvent(subject, phase, time.time(), attempt, detail)
        store.add_event(event)
        show(event)

    return LocalAgents(run_dir, config.layout, command, hostname, record)


def refuse_replica_without_api(config: JobConfig) -> None:
    """Replica recovery needs ranks that exchange gradients through the replica API; an
    ordinary DDP script would hang in its own ``init_process_group``."""
    if config.recovery != "replica":
        return
    for source in _script_sources(config):
        try:
            text = source.read_text(errors="replace")
        except OSError:
            continue
        if any(name in text for name in REPLICA_API):
            return
    raise EagleEyeError(
        f"--recovery replica needs a script that trains through the replica API "
        f"({REPLICA_API[0]}: Manager and OptimizerWrapper, docs/replica-api.md); "
        f"{config.script} and the modules "
        "beside it use none of it: run it with --recovery job"
    )


def refuse_snapshots_without_api(config: JobConfig) -> None:
    """Snapshot holders hold only what the ranks save through the checkpoint engine; a
    script that saves its checkpoints itself (``torch.save``) would restore none of it."""
    if not config.snapshots:
        return
    replica = config.recovery == "replica"
    names = SNAPSHOT_API_REPLICA if replica else SNAPSHOT_API
    for source in _script_sources(config):
        try:
            text = source.read_text(errors="replace")
        except OSError:
            continue
        if any(name in text for name in names):
            return
    if replica:
        raise EagleEyeError(
            f"--snapshots with --recovery replica: {config.script} saves its checkpoints "
            "itself, not through ft_runtime.replica.Snapshots; save through Snapshots "
            "(docs/replica-api.md) or drop --snapshots"
        )
    raise EagleEyeError(
        f"--snapshots: {config.script} saves its checkpoints itself, not through "
        "eagleeye.init().save_checkpoint; save through the session or drop --snapshots"
    )


SNAPSHOT_API = ("save_checkpoint", "CheckpointClient", "RankSnapshots")
SNAPSHOT_API_REPLICA = ("Snapshots", "CheckpointClient")

REPLICA_API = (
    "ft_runtime.replica",
    "from ft_runtime import replica",
    "ReplicaComm",
    "eagleeye.workload.replicated",
    "ft_runtime.ftar",
)


def _script_sources(config: JobConfig) -> list[Path]:
    """The script and the Python files beside it (its own helper modules)."""
    if config.module:
        spec = importlib.util.find_spec(config.script)
        origin = None if spec is None else spec.origin
        if origin is None:
            return []
        script = Path(origin)
    else:
        script = Path(config.script)
    return [script, *sorted(p for p in script.parent.glob("*.py") if p != script)]


def _continue(
    stored: StoredRun, supervisor: Supervisor, controller: Controller, store: RunStore
) -> None:
    """A resumed run starts as the attempt after its last, from the newest checkpoint its
    ranks reported, with a fresh restart budget; the resumption is recorded."""
    supervisor.attempt = stored.last_attempt
    controller.checkpoints.note_all(stored.checkpoints)
    reason = "resumed from the run's store (eagleeye run --resume)"
    event = LifecycleEvent(
        "job", Phase.RECOVERING, time.time(), stored.last_attempt, {"reason": reason}
    )
    store.add_event(event)


def resumed_job_config(run_dir: str, **flags: Any) -> JobConfig:
    """The configuration of the run in ``run_dir`` as its store holds it (faults are not
    injected again); ``flags`` override fields (the console's ``stream_ranks``)."""
    stored = read_stored_run(run_dir)
    saved = stored.config
    instrument = bool(saved.get("instrument", True))
    script, script_args, module = target_of(list(saved["command"]), instrument)
    fields: dict[str, Any] = {
        "script": script,
        "script_args": script_args,
        "module": module,
        "layout": layout_of(saved),
        "min_replicas": int(saved.get("min_replicas", replica_config.MIN_REPLICAS)),
        "max_restarts": int(saved.get("max_restarts", replica_config.MAX_RESTARTS)),
        "recovery": str(saved.get("recovery", "job")),
        "remediate": bool(saved.get("remediate", False)),
        "policy": saved.get("policy_file"),
        "snapshots": bool(saved.get("snapshots", False)),
        "instrument": instrument,
        "hang": dict(saved.get("hang") or {}),
        "no_step_notice_s": float(saved.get("no_step_notice_s", NO_STEP_NOTICE_S)),
        "resume_args": list(saved.get("resume_args") or []),
        "grace_period_s": float(saved.get("grace_period_s", 0.0)),
        "runs_dir": str(stored.run_dir.parent),
        "resume_dir": str(stored.run_dir),
    }
    return JobConfig(**{**fields, **flags})


def resume_env(controller: Controller) -> Callable[[int], dict[str, str]]:
    """A restarted attempt's ranks get the newest complete checkpoint known."""

    def env(attempt: int) -> dict[str, str]:
        newest = controller.checkpoints.newest() if attempt > 0 else None
        return {} if newest is None else {ENV_RESUME_FROM: newest}

    return env


def _record_fault(store: RunStore, show: Callable[[object], None]) -> Callable[[FaultFired], None]:
    def record(fired: FaultFired) -> None:
        spec = fired.spec
        store.add_fault(fired.time, fired.step, fired.attempt, spec.kind, spec.rank, str(spec))
        show(fired)

    return record


@contextmanager
def _stop_on_signals(controller: Controller, grace_s: float) -> Iterator[None]:
    """SIGTERM and SIGINT (what timeout, Slurm and Kubernetes send, and Ctrl-C) stop the
    job through the controller: no rank outlives `eagleeye run`. Only the main thread can
    take signals; elsewhere the caller stops the job."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: object) -> None:
        controller.request_stop(StopRequest(signal.Signals(signum).name, signum, grace_s))

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def detector_config(
    hang: Mapping[str, float] | None = None,
) -> tuple[HangLimits, DetectorsConfig | None]:
    """The hang limits (``hang`` flags over the config file's ``[hang]`` over the defaults)
    and the fused detectors: $EAGLEEYE_DETECTORS_CONFIG's when it lists any, else the
    live ones."""
    hang = hang or {}
    if not os.environ.get(CONFIG_ENV):
        return HangLimits.from_mapping(hang, "hang flags"), None
    file = load_config()
    limits = HangLimits.from_mapping({**asdict(file.hang), **hang}, "hang flags")
    if file.specs is DEFAULT_SPECS:  # the file sets fusion or limits only
        return limits, DetectorsConfig(live_config().specs, file.fusion, file.hang)
    return limits, file


def _holders(config: JobConfig, run_id: str, run_dir: Path) -> Holders | None:
    """The snapshot holders of the job (started by the caller), when it asked for them."""
    if not config.snapshots:
        return None
    return Holders(config.layout, run_id, (run_dir / "snapshots").resolve(), config.master_addr)


def _metrics(config: JobConfig, run_id: str) -> RunMetrics | None:
    """The run's Prometheus exporter, served when a port is asked for (0 picks one)."""
    if config.metrics_port is None:
        return None
    return RunMetrics.open(
        run_id,
        config.layout,
        config.metrics_port,
        config.metrics_address,
        config.gpu_metrics,
        config.metrics_linger_s,
        config.tls,
    )


def _alerts(config: JobConfig, metrics: RunMetrics | None) -> RunAlerts | None:
    """Alertmanager's webhook into the run, when a port is asked for; a bad token file or
    a busy port fails here (and stops the metrics server already started)."""
    if config.alerts_port is None:
        return None
    try:
        if not config.alerts_token_file:
            raise EagleEyeError(
                "--alerts-port needs --alerts-token-file, the file with the token "
                "Alertmanager sends (eagleeye alerts alertmanager --token-file)"
            )
        tls = None if config.tls is None else config.tls.context()
        alerts = RunAlerts(config.alerts_token_file, config.alerts_port, config.alerts_address, tls)
    except EagleEyeError:
        if metrics is not None:
            metrics.linger_s = 0.0
            metrics.close()
        raise
    # an alert naming this host lands on the job's node here (set before it serves)
    visible = config.env.get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"))
    alerts.locate = HostPlaces(socket.gethostname(), config.layout.ranks(), visible).locate
    return alerts.start()


def _polling(metrics: RunMetrics | None, sources: HostSources | None) -> Any:
    """The exporter's own GPU polling, unless the host's sources read the GPUs."""
    if metrics is None or (sources is not None and sources.config.nvml is not None):
        return nullcontext()
    return metrics.polling()


def _host_sources(config: JobConfig, env: Mapping[str, str]) -> HostSources | None:
    """This host's source loop, when the run reads any of its sources."""
    wanted = HostSourcesConfig(
        every_s=config.sources_period_s,
        nvml=config.gpu_metrics if config.gpu_findings else None,
        dcgm_url=config.dcgm_url,
        kernel_log=config.kernel_log,
        nccl_dump_dir=config.nccl_dump_dir,
        host_counters=config.host_counters,
        visible_devices=env.get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES")),
    )
    return HostSources(wanted, config.layout) if wanted.any else None


def _nccl_dump_env(config: JobConfig, env: Mapping[str, str]) -> dict[str, str]:
    """With --nccl-dump-dir, every rank's flight recorder dumps there on a timeout."""
    if config.nccl_dump_dir is None:
        return {}
    folder = Path(config.nccl_dump_dir).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    wanted = {**NCCL_DUMP_ENV, "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": f"{folder}/nccl_trace_rank_"}
    return {name: value for name, value in wanted.items() if name not in env}


def _also_export(metrics: RunMetrics, show: Callable[[object], None]) -> Callable[[object], None]:
    def update(item: object) -> None:
        metrics.update(item)
        show(item)

    return update
