"""Turns per-step samples of each rank into Frames, the detectors' input.

A rank's step arrives as one batch (the hook sends it at step end), so a frame is built per
(rank, step) from the samples of that step: ``step_time``, ``section.*`` timings, loss and
the other metrics, and ``collective_time``: the hook's own figure when it sent one (the wall
time with a collective open, where asynchronous ones overlap), else the sum of the step's
collective durations.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

from collector.types import Frame, Sample, Subject

COLLECTIVE = "collective"


def subject_of(labels: Mapping[str, str]) -> Subject:
    """The rank (with its replica and node) that labels name; the job when they name none."""
    rank = labels.get("rank")
    replica = labels.get("replica")
    return Subject(
        replica=None if replica is None else int(replica),
        rank=None if rank is None else int(rank),
        node=labels.get("node"),
    )


def frames_from_samples(samples: Iterable[Sample]) -> list[Frame]:
    """Groups step samples by (subject, step) into frames, in arrival order.

    Samples without a step (events) are left out: they are not part of a step's vector.
    """
    values: dict[tuple[Subject, int], dict[str, float]] = defaultdict(dict)
    spent: dict[tuple[Subject, int], float] = defaultdict(float)
    times: dict[tuple[Subject, int], float] = {}
    for sample in samples:
        if sample.step is None or sample.name.startswith("event."):
            continue
        key = (subject_of(sample.labels), sample.step)
        frame_values = values[key]
        if sample.name == COLLECTIVE:
            spent[key] += sample.value
        else:
            frame_values[sample.name] = sample.value
        times[key] = max(times.get(key, sample.time), sample.time)
    for key, seconds in spent.items():
        values[key].setdefault("collective_time", seconds)
    return [
        Frame(subject, step, times[(subject, step)], vals)
        for (subject, step), vals in values.items()
    ]
