"""Routes what arrives from ranks and the supervisor into the store and into frames."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable

from collector.frames import COLLECTIVE, frames_from_samples, subject_of
from collector.types import Frame, Sample
from eagleeye.store import RunStore
from ft_runtime.types import LifecycleEvent, Phase

log = logging.getLogger(__name__)
INT64 = 2**63


class LaunchedAttempts:
    """The attempt each rank was last launched as, from the supervisor's events.

    A rank killed for a restart may still have telemetry on its way; arriving after the
    relaunch, it would tell the detectors that the new process has already stepped (and so
    needs no start-up grace). Such samples are stale: they are stored, never turned into
    frames.
    """

    def __init__(self) -> None:
        self._attempt: dict[str, int] = {}

    def note(self, events: Iterable[LifecycleEvent]) -> None:
        for event in events:
            if event.subject.startswith("rank:") and event.phase is Phase.LAUNCH:
                rank = event.subject.removeprefix("rank:")
                self._attempt[rank] = int(event.detail.get("attempt", event.attempt))

    def current(self, sample: Sample) -> bool:
        """Whether ``sample`` comes from its rank's newest launch (True when unknown)."""
        launched = self._attempt.get(sample.labels.get("rank", ""))
        attempt = _int(sample.labels.get("attempt"))
        return launched is None or attempt is None or attempt >= launched


def ingest_samples(
    store: RunStore, samples: list[Sample], current: Callable[[Sample], bool] | None = None
) -> list[Frame]:
    """Stores telemetry (step samples, collectives, checkpoint and fault events) and returns
    the frames it completes, from the samples that are ``current`` (all by default)."""
    steps = []
    for sample in samples:
        name = sample.name
        if name == COLLECTIVE:
            store.add_collective(sample)
        elif name == "event.checkpoint" or name == "event.restore":
            _store_checkpoint(store, sample)
        elif name == "event.fault":
            labels = sample.labels
            store.add_fault(
                sample.time,
                sample.step,
                _int(labels.get("attempt")),
                labels.get("kind", "?"),
                _int(labels.get("rank")),
                labels.get("spec", ""),
            )
        if not name.startswith("event."):
            steps.append(sample)
    store.add_samples(s for s in steps if s.name != COLLECTIVE)
    return frames_from_samples([s for s in steps if current is None or current(s)])


def _store_checkpoint(store: RunStore, sample: Sample) -> None:
    labels = sample.labels
    tier = labels.get("tier", "disk")
    if sample.name == "event.restore":
        state = "RESTORED"
    else:  # a snapshot in a holder's memory is cached; one written to disk is persistent
        state = "CACHED" if tier == "memory" else "PERSISTENT"
    step = sample.value
    if not (math.isfinite(step) and 0 <= step < INT64 and step == int(step)):
        log.warning("dropped a %s event whose step is %r, not a step number", sample.name, step)
        return
    store.add_checkpoint(
        sample.time,
        int(step),
        state,
        tier,
        rank=_int(labels.get("rank")),
        attempt=_int(labels.get("attempt")),
        path=labels.get("path"),
        nbytes=_int(labels.get("bytes")),
        seconds=_seconds(labels.get("seconds")),
    )


def lifecycle_frames(events: Iterable[LifecycleEvent]) -> list[Frame]:
    """Frames that tell detectors a rank was launched or exited."""
    frames = []
    for event in events:
        if not event.subject.startswith("rank:"):
            continue
        labels = {
            "rank": event.subject.removeprefix("rank:"),
            "replica": str(event.detail.get("replica", "")),
            "node": str(event.detail.get("node", "")),
        }
        subject = subject_of({k: v for k, v in labels.items() if v})
        if event.phase is Phase.LAUNCH:
            frames.append(Frame(subject, None, event.time, {"launched": 1.0}))
        elif event.phase is Phase.EXITED:
            frames.append(
                Frame(
                    subject,
                    None,
                    event.time,
                    {
                        "exit_code": float(event.detail["exit_code"]),
                        "collateral": float(bool(event.detail.get("collateral"))),
                        "attempt": float(event.attempt),
                    },
                )
            )
    return frames


def _int(value: str | None) -> int | None:
    """An integer label within 64 bits, else None (a label that is no count says nothing)."""
    try:
        number = None if value is None else int(value)
    except ValueError:
        return None
    return number if number is None or -INT64 <= number < INT64 else None


def _seconds(value: str | None) -> float | None:
    """A duration label: a finite number of seconds from 0, else None."""
    try:
        seconds = None if value is None else float(value)
    except ValueError:
        return None
    return seconds if seconds is not None and 0 <= seconds < math.inf else None
