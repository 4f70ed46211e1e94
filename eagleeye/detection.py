"""The detectors of a live run: hard rules answered at once, the rest through fusion.

Two tiers run in the controller. The hard rules (a process exit, a non-finite loss) and
the progress-stall detector stand alone: a kill or a hang is answered the moment it shows,
never held by fusion. Everything statistical (peer outliers, loss and grad-norm spikes,
change points in step time, the collective-hang wait-for graph) runs in one
``DetectorPipeline`` whose fusion turns the raw findings of one fault into one finding.

The in-loop hook reports sections and collectives; the peer detector compares the trace
format's ``compute_ms``, ``data_wait_ms`` and ``comm_ms``, which ``peer_features`` derives
from them (docs/trace-format.md). The exported traces of recorded runs use it too.

The live parameters are stricter than the generated-trace defaults: a shared, loaded host
makes step and section times noisy, and a soft finding on a healthy run is a false alarm.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from collector.frames import subject_of
from collector.types import Frame, Sample
from collector.vocabulary import canonical_values
from detectors.base import Detector
from detectors.config import DetectorsConfig, DetectorSpec
from detectors.fusion import FusionPolicy
from detectors.hang import FR_BEHIND, FR_PENDING
from detectors.pipeline import DetectorPipeline
from detectors.progress import ProgressStall
from detectors.rules import NonFiniteLoss, ProcessExit
from detectors.types import Finding

#: The live peer comparison: compute, data wait and collective time, in milliseconds.
LIVE_PEER_FEATURES: Mapping[str, tuple[object, ...]] = {
    "compute_ms": (1, "slow_rank"),
    "data_wait_ms": (1, "dataloader_stall"),
}


def live_specs(hang_k: float, hang_min_silence_s: float) -> tuple[DetectorSpec, ...]:
    """The statistical detectors of a live run.

    Peer outliers need a 50 % shift in three of five steps, held two (a loaded host's
    jitter stays well under it; an injected straggler is far over it); change points need
    a replica's or node's step time doubled and held (on a shared 2-core host, healthy
    tiny steps of 25 to 35 ms jump to 50 to 70 ms for several steps at a time, which a
    50 % shift with ``h`` = 2 took for a change point); the collective hang waits as long
    as the progress
    detector does, so the two never race to restart a job that is only slow.
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
        # The highest rank's loss of a small model early in training swings by a quarter
        # from step to step: a live spike must be half again its level, a gradient-norm
        # spike twice it, and neither is judged in the first 20 steps.
        DetectorSpec("loss_spike", {"reduce": "max", "min_ratio": 0.5, "warmup": 20}),
        DetectorSpec("grad_norm_spike", {"min_ratio": 1.0, "warmup": 20}),
        DetectorSpec(
            "throughput_change",
            {"feature": "step_time.max", "min_shift": 1.0, "h": 8.0, "warmup": 10},
        ),
        DetectorSpec("collective_hang", {"k": hang_k, "min_silence_s": hang_min_silence_s}),
    )


def live_config(hang_k: float = 10.0, hang_min_silence_s: float = 5.0) -> DetectorsConfig:
    """The fused detectors of a live run (see ``live_specs``) with the default fusion."""
    return DetectorsConfig(live_specs(hang_k, hang_min_silence_s), FusionPolicy())


def replay_config(hang_k: float = 10.0, hang_min_silence_s: float = 5.0) -> DetectorsConfig:
    """The live detector set as one pipeline, for traces recorded from runs: the hard rules
    that run unfused in the controller join the fused detectors."""
    rules = (DetectorSpec("process_exit"), DetectorSpec("non_finite_loss"))
    return DetectorsConfig(rules + live_specs(hang_k, hang_min_silence_s), FusionPolicy())


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
    out = dict(values)
    canon = canonical_values(values)  # the hook's names are aliases of the peer features
    comm, data = canon.get("comm_ms"), canon.get("data_wait_ms")
    if comm is not None:
        out["comm_ms"] = comm
    if data is not None:
        out["data_wait_ms"] = data
    if "step_time" in canon:
        checkpoint = 1000.0 * canon.get("section.checkpoint", 0.0)
        own = 1000.0 * canon["step_time"] - (comm or 0.0) - (data or 0.0) - checkpoint
        out["compute_ms"] = max(own, 0.0)
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
    all go in; findings come out fused.
    """

    pipeline: DetectorPipeline
    name: str = "fused"

    def process(self, frame: Frame) -> list[Finding]:
        if "step_time" in frame.values:
            frame = replace(frame, values=peer_features(frame.values))
        return self.pipeline.process(frame)

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
    hang_k: float = 10.0,
    hang_min_silence_s: float = 5.0,
    config: DetectorsConfig | None = None,
) -> list[Detector]:
    """Hard rules and progress stall first (unfused), then the fused pipeline.

    Args:
        hang_k: silence, in median step times, that counts as a hang.
        hang_min_silence_s: floor on that silence.
        config: the fused detectors; ``live_config`` by default.
    """
    fused = config if config is not None else live_config(hang_k, hang_min_silence_s)
    return [
        ProcessExit(),
        NonFiniteLoss(),
        ProgressStall(k=hang_k, min_silence_s=hang_min_silence_s),
        FusedDetectors(fused.build()),
    ]
