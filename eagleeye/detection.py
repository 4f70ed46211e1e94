"""The detectors of a live run: hard rules answered at once, the rest through fusion.

Two tiers run in the controller. The hard rules (a process exit, a non-finite loss) and
the progress detector (hangs, from evidence: /proc, the collective wait-for graph) stand
alone: a kill or a hang is answered the moment it shows, never held by fusion. Everything
statistical (peer outliers, loss and grad-norm spikes, change points in step time) runs in
one ``DetectorPipeline`` whose fusion turns the raw findings of one fault into one finding.
Each attempt of the whole job is a new baseline: the pipeline is rebuilt when the job
restarts, so nothing of an earlier attempt's statistics fires on the next one.

The in-loop hook reports sections and collectives; the peer detector compares the trace
format's ``compute_ms``, ``data_wait_ms`` and ``comm_ms``, which ``peer_features`` derives
from them (docs/trace-format.md). The exported traces of recorded runs use it too.

The live parameters are stricter than the generated-trace defaults: a shared, loaded host
makes step and section times noisy, and a soft finding on a healthy run is a false alarm.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from collector.frames import subject_of
from collector.types import Frame, Sample, Subject
from collector.vocabulary import canonical_values
from detectors.base import Detector
from detectors.changepoint import ThroughputChange
from detectors.config import DetectorsConfig, DetectorSpec
from detectors.edge import derive
from detectors.fusion import FusionPolicy
from detectors.generic import GENERIC_KIND
from detectors.hang import FR_BEHIND, FR_PENDING
from detectors.numerics import SeriesSpike
from detectors.peer import DEFAULT_FEATURES, PeerFeature
from detectors.pipeline import DetectorPipeline
from detectors.progress import PROC_FEATURES, HangLimits, ProgressStall
from detectors.rules import MemoryFatal, NonFiniteLoss, ProcessExit, ThermalThrottle, XidError
from detectors.standout import StandsOut
from detectors.trend import DEFAULT_TRENDS
from detectors.types import Finding, Severity
from ft_runtime.types import Action, ActionKind, LifecycleEvent, Outcome, OutcomeStatus

# Reports the progress detector reads and the fused ones must not take for a step: a look
# at /proc, a rank waiting in a collective or pausing.
_NOT_FOR_FUSION = PROC_FEATURES | {"in_collective", "pause"}

#: The rules a host applies to its GPUs' sources (an XID, uncorrectable memory errors, a
#: thermal throttle held two polls): in a live run on the hosts, in a replay with the rest.
HOST_GPU_RULES = (XidError, MemoryFatal, ThermalThrottle)

#: The live peer comparison: compute, data wait and collective time, in milliseconds.
#: A rank's excess must also be 20 ms at least: a data wait of 1.8 ms against its peers'
#: 0.5 ms is four times theirs and costs nothing.
LIVE_PEER_FEATURES: Mapping[str, PeerFeature] = {
    "compute_ms": PeerFeature(1, "slow_rank", min_abs=20.0, offset=False),
    "data_wait_ms": PeerFeature(1, "dataloader_stall", min_abs=20.0, offset=False, step_share=0.02),
}


def live_specs() -> tuple[DetectorSpec, ...]:
    """The statistical detectors of a live run.

    Peer outliers need a 50 % shift in three of five steps, held two (a loaded host's
    jitter stays well under it; an injected straggler is far over it). A job whose ranks'
    compute times keep within 10 % of their usual share (GPUs: 1 to 4 %; a
    shared CPU host: 20 to 90 %) is also judged by the precise peer comparison of traces
    (``when_quiet``: a 10 % slower rank or node, a NIC's collective time, a slow leak,
    each rank's fixed offset removed); change points need
    a replica's or node's step time doubled and held (on a shared 2-core host, healthy
    tiny steps of 25 to 35 ms jump to 50 to 70 ms for several steps at a time, which a
    50 % shift with ``h`` = 2 took for a change point). Hangs are the progress detector's,
    which has the evidence (/proc) that silence alone lacks.
    """
    return (
        DetectorSpec(
            "peer_outlier",
            {
                "features": LIVE_PEER_FEATURES,
                "min_shift": 0.5,
                "persistence": 2,
                "z": 6.0,
                "warmup": 5,
                "offset_alpha": 0.0,  # a 50 % bar: GPUs' few per cent of spread are moot
            },
        ),
        DetectorSpec("when_quiet", {"detector": "peer_outlier"}),
        # The highest rank's loss over a batch of a few dozen tokens doubles now and then in
        # a healthy run (the base preset, 2 x 32 tokens): a live spike must be three times
        # its level, a gradient-norm spike twice it, neither judged in the first 20 steps.
        # A loss that moves a few per cent a step (a large batch's) is quiet, and a quarter
        # over its level is a spike there, as in traces.
        DetectorSpec(
            "loss_spike", {"reduce": "max", "min_ratio": 2.0, "warmup": 20, "quiet_ratio": 0.25}
        ),
        DetectorSpec("grad_norm_spike", {"min_ratio": 1.0, "warmup": 20}),
        # A metric no one reads (a user's own, a GPU's utilisation) needs the live peer bar
        # too; a leak is a trend whatever the host's jitter. A host's 8 ranks are few
        # peers: their slopes agree now and then by chance, and a memory that wanders
        # about its footprint rose for 8 reports often enough to be a leak. The slope
        # is over 16 reports, against the peers' usual spread of slopes.
        DetectorSpec("generic_peer", {"min_shift": 0.5, "warmup": 5}),
        DetectorSpec("trend", {"warmup": 5, "window": 16, "spread_memory": 64}),
        DetectorSpec(
            "throughput_change",
            {"feature": "step_time.max", "min_shift": 1.0, "h": 8.0, "warmup": 10},
        ),
    )


#: The live detectors that judge a rank against the other ranks of its host or against its
#: own past: across hosts each agent runs them on its ranks' full series, which never leave
#: the host (the controller sees summaries: ``eagleeye.agents.hostjudge``).
HOST_TIER = ("when_quiet", "generic_peer", "trend")

#: What the host tier can find: the peer comparison's kinds, a leak's, a metric no one reads.
HOST_TIER_KINDS = frozenset(
    {f.kind for f in DEFAULT_FEATURES.values()} | set(DEFAULT_TRENDS.values()) | {GENERIC_KIND}
)


def host_tier_config() -> DetectorsConfig:
    """The members of ``live_specs`` named in ``HOST_TIER``, fused by the default policy."""
    return DetectorsConfig(tuple(s for s in live_specs() if s.name in HOST_TIER), FusionPolicy())


def host_peer_config() -> DetectorsConfig:
    """The precise peer comparison of ``live_specs`` (``when_quiet``), for the controller
    to compare the hosts' medians with each other: a node 10 % slower than the others."""
    specs = tuple(s for s in live_specs() if s.name == "when_quiet")
    return DetectorsConfig(specs, FusionPolicy())


def live_config() -> DetectorsConfig:
    """The fused detectors of a live run (see ``live_specs``) with the default fusion."""
    return DetectorsConfig(live_specs(), FusionPolicy())


def replay_config(limits: HangLimits | None = None) -> DetectorsConfig:
    """The live detector set as one pipeline, for traces recorded from runs: the hard rules
    that run unfused in the controller and on the hosts' GPU sources (an XID, uncorrectable
    memory errors, a held thermal throttle) join the fused detectors, and the collective-hang
    wait-for graph stands in for the progress detector (a trace has no /proc and no clock
    between its rows), with its silence limit."""
    process_exit, *host_rules, hang = replay_rules(limits)
    rules = (process_exit, DetectorSpec(NonFiniteLoss.name), *host_rules)
    return DetectorsConfig((*rules, *live_specs(), hang), FusionPolicy())


def replay_rules(limits: HangLimits | None = None) -> tuple[DetectorSpec, ...]:
    """What judges forwarded evidence in a replay: a process exit, the hosts' GPU rules
    (an XID, uncorrectable memory errors, a held thermal throttle) and, standing in for
    the progress detector, the collective-hang wait-for graph with its silence limit."""
    limits = limits or HangLimits()
    hang = DetectorSpec(
        "collective_hang",
        {
            "k": limits.k,
            "min_silence_s": limits.min_silence_s,
            "stopped_k": limits.stopped_k,
            "stopped_s": limits.stopped_s,
        },
    )
    return (*(DetectorSpec(rule.name) for rule in (ProcessExit, *HOST_GPU_RULES)), hang)


def peer_features(values: Mapping[str, float]) -> dict[str, float]:
    """Adds the peer-comparison features derived from the hook's step report.

    ``comm_ms`` is the step's collective time, ``data_wait_ms`` its data section and
    ``compute_ms`` what remains of the step (checkpoint writing excluded): the time the rank
    itself worked. A straggler's compute rises while its peers' collective wait rises.

    >>> peer_features({"step_time": 0.5, "collective_time": 0.1, "section.data": 0.05})
    ... # doctest: +NORMALIZE_WHITESPACE
    {'step_time': 0.5, 'collective_time': 0.1, 'section.data': 0.05,
     'comm_ms': 100.0, 'data_wait_ms': 50.0, 'compute_ms': 350.0}
    """
    canon = derive(canonical_values(values))  # the hook's names are the features' aliases
    out = dict(values)
    out.update({k: canon[k] for k in ("comm_ms", "data_wait_ms", "compute_ms") if k in canon})
    return out


def flight_record_frames(samples: Iterable[Sample]) -> list[Frame]:
    """Frames for the collective-hang detector from flight-recorder event samples
    (``collector.nccl_hang``): one per rank a dump says waits in, or never entered, the
    collective of the hang."""
    return [
        Frame(subject_of(s.labels), None, s.time, {s.name: s.value})
        for s in samples
        if s.name in (FR_BEHIND, FR_PENDING) and "rank" in s.labels
    ]


@dataclass
class FusedDetectors:
    """The pipeline as one controller detector, fed frames with the peer features added.

    Rank frames, lifecycle frames and the node and replica frames of the step aggregator
    all go in (the looks at /proc, the waits and the pauses stay out: they are the progress
    detector's); findings
    come out fused. A restart of the whole job (``job_restart``) releases what the pipeline
    holds and starts a fresh one from ``config``.
    """

    pipeline: DetectorPipeline
    name: str = "fused"
    config: DetectorsConfig | None = None

    def process(self, frame: Frame) -> list[Finding]:
        values = frame.values
        if "job_restart" in values:
            return self._new_baseline()
        if values.keys() <= _NOT_FOR_FUSION:
            return []
        if "step_time" in values:
            frame = replace(frame, values=peer_features(values))
        return self.pipeline.process(frame)

    def _new_baseline(self) -> list[Finding]:
        held = self.pipeline.flush()
        if self.config is not None:
            self.pipeline = self.config.build()
        return held

    def poll(self, now: float) -> list[Finding]:
        return self.pipeline.poll(now)

    def note(self, finding: Finding) -> None:
        """A finding of the unfused tier: it explains this tier's symptoms of the same
        fault (a throughput drop after a kill) and absorbs its duplicates (the collective
        hang of a rank the stall detector already named)."""
        self.pipeline.note(finding)

    def flush(self) -> list[Finding]:
        """End of the run: the last buffered step is compared and held findings released."""
        return self.pipeline.flush()


def live_detectors(
    limits: HangLimits | None = None, config: DetectorsConfig | None = None
) -> list[Detector]:
    """Hard rules and the progress detector first (unfused), then the fused pipeline.

    Args:
        limits: the limits of hang detection; the defaults when None.
        config: the fused detectors; ``live_config`` by default.
    """
    fused = config if config is not None else live_config()
    limits = limits or HangLimits()
    return [
        ProcessExit(),
        NonFiniteLoss(),
        ProgressStall(**asdict(limits)),
        FusedDetectors(fused.build(), config=fused),
    ]


class FlightRecordHang:
    """A rank an NCCL flight-recorder dump shows behind its peers (it never entered the
    collective they wait in): the dump is written when NCCL's watchdog gives up, so it is
    evidence, not silence. One finding per rank and collective."""

    name = "nccl_flight_record"

    def __init__(self) -> None:
        self._seen: set[tuple[object, float]] = set()

    def process(self, frame: Frame) -> list[Finding]:
        missing = frame.values.get(FR_BEHIND)
        if missing is None or frame.subject.rank is None:
            return []
        key = (frame.subject, missing)
        if key in self._seen:
            return []
        self._seen.add(key)
        evidence = {FR_BEHIND: missing}
        return [
            Finding(
                "hang",
                frame.subject,
                1.0,
                Severity.CRITICAL,
                frame.time,
                frame.step,
                evidence,
                self.name,
            )  # fmt: skip
        ]

    def poll(self, now: float) -> list[Finding]:
        return []


def reduced_detectors() -> list[Detector]:
    """The detectors of `eagleeye controller`, fed telemetry reduced on the hosts
    (``eagleeye.agents.intake``): a non-finite loss or gradient norm on the rank that
    sent it (a non-finite value always stands out, so its row reaches the controller), a
    rank that stands out against its host's median step after step (``StandsOut``: slow
    compute, a data-loader stall), a change point in the job's slowest rank's step time
    (the job frame's ``step_time.max``, the bar of ``live_specs``) and a spike of the
    job's highest loss (``loss.max``, the live loss spike's bars), on the job."""
    return [
        NonFiniteLoss(),
        StandsOut(),
        OnJobFrames(ThroughputChange("step_time.max", min_shift=1.0, h=8.0, warmup=10)),
        OnJobFrames(SeriesSpike("loss.max", "loss_spike", **_live_loss_spike())),
    ]


def _live_loss_spike() -> dict[str, Any]:
    """The live loss spike's bars (``live_specs``), for a series already reduced."""
    (spec,) = (s for s in live_specs() if s.name == "loss_spike")
    return {k: v for k, v in spec.params.items() if k != "reduce"}


@dataclass
class OnJobFrames:
    """``detector`` fed the job's frames only (a reduced step's slowest rank and highest
    loss are the job's; a host that stands out has its own frame, now and then, which is
    no series: its step time's change points were false ones)."""

    detector: Detector
    name: str = ""

    def __post_init__(self) -> None:
        self.name = self.name or self.detector.name

    def process(self, frame: Frame) -> Sequence[Finding]:
        return self.detector.process(frame) if frame.subject.scope == "job" else ()

    def poll(self, now: float) -> Sequence[Finding]:
        return self.detector.poll(now)


def host_detectors() -> list[Detector]:
    """The rules the host's sources feed (``eagleeye.hostsources``): a GPU's XID, its
    uncorrectable memory errors, a thermal throttle held two polls, a rank an NCCL dump
    shows behind. Each finding names the rank using the GPU (or the node)."""
    return [*(rule() for rule in HOST_GPU_RULES), FlightRecordHang()]


def fenced_hang(event: LifecycleEvent, last_step: Mapping[int, int]) -> tuple[Finding, Outcome]:
    """A replica the quorum dropped as hung (``event``, from the replica supervisor): its
    cause, the ``hang`` on the late ranks with the wait, the limit and the ranks found
    stopped as evidence (at the earliest of the late ranks' ``last_step``), and its
    fencing kill, the action done."""
    replica = int(event.subject.removeprefix("replica:"))
    seen = event.detail.get("evidence") or {}
    late = [int(r) for r in seen.get("late_ranks", [])]
    stopped = [int(r) for r in seen.get("stopped_ranks", [])]
    waited, limit = float(seen.get("waited_s", 0.0)), float(seen.get("limit_s", 0.0))
    evidence = {"fenced": 1.0, "waited_s": waited, "limit_s": limit}
    evidence.update({f"late_rank_{rank}": 1.0 for rank in late})
    evidence.update({f"stopped_rank_{rank}": 1.0 for rank in stopped})
    steps = [last_step[r] for r in late if r in last_step]
    score = waited / limit if limit > 0 else 1.0
    finding = Finding(
        "hang",
        Subject(replica=replica, rank=late[0] if len(late) == 1 else None),
        max(score, 1.0) if stopped else score,  # a stopped process is a hang outright
        Severity.CRITICAL,
        event.time,
        min(steps) if steps else None,
        evidence,
        "quorum_stall",
    )
    action = Action(ActionKind.ISOLATE, event.subject, str(event.detail.get("reason", "")), "")
    return finding, Outcome(action, OutcomeStatus.DONE, "fenced: its ranks were killed", event.time)
