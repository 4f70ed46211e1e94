"""`eagleeye run` as a library call: set up a run folder, launch, supervise, record."""

from __future__ import annotations

import argparse
import importlib.util
import os
import secrets
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from dataclasses import fields as dataclass_fields
from pathlib import Path
from typing import Any

from collector.transport import TelemetryReceiver
from detectors.config import CONFIG_ENV, DEFAULT_SPECS, DetectorsConfig, load_config
from detectors.progress import HangLimits, ProgressStall
from eagleeye.config import ENV_CHECKPOINT_DIR, ENV_RUN_DIR, ENV_TELEMETRY
from eagleeye.controller import Controller, ControllerReport
from eagleeye.detection import live_config, live_detectors
from eagleeye.errors import EagleEyeError
from eagleeye.gpus import NvmlFactory
from eagleeye.runalerts import RunAlerts
from eagleeye.runmetrics import RunMetrics
from eagleeye.snapshots import Holders
from eagleeye.stacks import StackCapture
from eagleeye.store import RunStore, StoreMembershipLog, create_run_dir, new_run_id
from ft_runtime.faults import ENV_INJECT, load_scenario, parse_specs
from ft_runtime.layout import ENV_CATCHUP_TOKEN, ENV_SERVE_NICE, JobLayout
from ft_runtime.supervisor import JobSupervisor, LaunchSpec
from remediation.config import load_policy
from remediation.policy import Policy, replica_restart_policy, synchronous_restart_policy
from remediation.remediator import Remediator

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
    max_restarts: int = 3
    recovery: str = "job"
    remediate: bool = False
    inject: Sequence[str] = ()
    runs_dir: str = "runs"
    run_id: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    hang: Mapping[str, float] = field(default_factory=dict)  # HangLimits set by flags
    instrument: bool = True  # zero-code telemetry (eagleeye.boot) in every rank
    stall_factor: float = 1.0  # the hang limit of replica recovery: QuorumService's
    stall_floor_s: float = 0.05  # defaults (kept here so that flags need no torch import)
    lateness_factor: float = 2.0
    min_replicas: int = 1
    joiner_nice: int = 10
    serve_nice: int = 10
    policy: str | None = None
    metrics_port: int | None = None  # serve Prometheus metrics (0: a free port)
    metrics_address: str = "127.0.0.1"
    metrics_linger_s: float = 0.0  # the final state stays scrapable this long after the run
    gpu_metrics: NvmlFactory | None = None  # each node's NVML module, when GPUs are polled
    alerts_port: int | None = None  # Alertmanager's webhook into this run (0: a free port)
    alerts_address: str = "127.0.0.1"
    alerts_token_file: str | None = None  # the bearer token Alertmanager sends
    snapshots: bool = False  # one snapshot holder per node; checkpoints go to memory

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
            if spec.rank >= self.layout.world_size:
                raise EagleEyeError(
                    f"fault {spec} names rank {spec.rank}, but the job has "
                    f"{self.layout.world_size} ranks"
                )

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
        gpu_metrics=_gpu_metrics(getattr(args, "gpu_metrics", "off")),
        alerts_port=getattr(args, "alerts_port", None),
        alerts_address=getattr(args, "alerts_address", "127.0.0.1"),
        alerts_token_file=getattr(args, "alerts_token_file", None),
        hang=hang_flags(args),
        instrument=getattr(args, "instrument", True),
    )


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
    config: JobConfig, launch: LaunchSpec, store: RunStore | None = None
) -> JobSupervisor:
    """The synchronous baseline, or replicas as the unit of failure. With a run store, the
    quorum coordinator records its memberships there and can restart from them."""
    if config.recovery != "replica":
        return JobSupervisor(launch, max_restarts=config.max_restarts)
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
        log=None if store is None else StoreMembershipLog(store),
    )
    return ReplicaSupervisor(
        launch, quorum, max_restarts=config.max_restarts, joiner_nice=config.joiner_nice
    )


def run_job(config: JobConfig, on_update: Callable[[object], None] | None = None) -> JobResult:
    """Runs a job to its end (success, failure, or spent restart budget)."""
    command = config.command()
    limits, fused = _detector_config(config)  # a bad config file fails before any launch
    run_id = config.run_id or new_run_id()
    metrics = _metrics(config, run_id)  # a busy port fails here, before the run folder
    alerts = _alerts(config, metrics)
    run_dir = create_run_dir(config.runs_dir, run_id)
    store = RunStore(run_dir)
    receiver = TelemetryReceiver()
    env = {
        **config.env,
        ENV_TELEMETRY: receiver.address,
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
    launch = LaunchSpec(
        command,
        config.layout,
        run_id,
        str(run_dir / "logs"),
        config.master_addr,
        config.master_port,
        env,
    )
    supervisor = supervisor_for(config, launch, store)
    policy = policy_for(config)
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
        },
    )
    detectors = live_detectors(limits, fused)
    # --remediate enables actions; without it the policy decides (files default to dry-run).
    remediator = Remediator(policy, supervisor, dry_run=False if config.remediate else None)
    show = on_update or (lambda item: None)
    if metrics is not None:
        metrics.remediator = remediator
        metrics.watch(detectors)
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
        inbox=None if alerts is None else alerts.take,
    )
    try:
        with holders if holders is not None else nullcontext(), _polling(metrics):
            report = controller.run()
        store.set_meta(
            "result",
            {
                "succeeded": report.succeeded,
                "started": report.started,
                "ended": report.ended,
                "attempts": supervisor.attempt + 1,
            },
        )
    finally:
        receiver.close()
        store.close()
        if alerts is not None:
            alerts.close()
        if metrics is not None:
            metrics.close()  # after lingering, when asked to
    return JobResult(run_dir, report)


def _detector_config(config: JobConfig) -> tuple[HangLimits, DetectorsConfig | None]:
    """The hang limits (flags over the config file's ``[hang]`` over the defaults) and the
    fused detectors: $EAGLEEYE_DETECTORS_CONFIG's when it lists any, else the live ones."""
    if not os.environ.get(CONFIG_ENV):
        return HangLimits.from_mapping(config.hang, "hang flags"), None
    file = load_config()
    limits = HangLimits.from_mapping({**asdict(file.hang), **config.hang}, "hang flags")
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
        alerts = RunAlerts(config.alerts_token_file, config.alerts_port, config.alerts_address)
    except EagleEyeError:
        if metrics is not None:
            metrics.linger_s = 0.0
            metrics.close()
        raise
    return alerts.start()


def _polling(metrics: RunMetrics | None) -> Any:
    return nullcontext() if metrics is None else metrics.polling()


def _gpu_metrics(source: str) -> NvmlFactory | None:
    """``--gpu-metrics``: off, or NVML (pynvml) on every node."""
    if source == "off":
        return None
    from eagleeye.gpus import pynvml_factory

    return pynvml_factory()


def _also_export(metrics: RunMetrics, show: Callable[[object], None]) -> Callable[[object], None]:
    def update(item: object) -> None:
        metrics.update(item)
        show(item)

    return update
