"""An agent's side of its ranks' telemetry: received on the host, kept there raw,
reduced to one summary per step for the controller.

The ranks send their hook's telemetry to the agent (a loopback socket, signed with a key
made for the agent's run) as they would to `eagleeye run`. Every sample of the host's
own ranks is appended to ``<folder>/telemetry.jsonl`` (one ``Sample.to_json`` a line:
the raw per-rank series stay on the host). The file is rotated when it reaches
``raw_max_bytes`` (64 MiB by default): it becomes ``telemetry.jsonl.1``, the older ones
move up by one, and only ``raw_keep`` of them (4) are kept, so the raw series take at
most about ``(raw_keep + 1) × raw_max_bytes`` of the host's disk, the newest kept.
Events (checkpoints, faults, a loop that listens for a checkpoint request) are few
and go to the controller as they are; step samples become per-rank frames with the
peer features (``compute_ms``, ``data_wait_ms``, ``comm_ms``) added, and a step is
summarised (``summarise``, ``HostSteps``) once every rank of the host has sent its step
report (``step_time``), ``wait_s`` after the first of them came, or once a later step is
complete; steps go out in order, once each. With a ``judge``, each step of every rank is
judged on the host too (``eagleeye.agents.hostjudge``). Progress reports (a
collective a rank waits in, a pause, a look at /proc) stay on the host: each ``take``
leaves them, with the step reports, in ``marks`` for the agent's view of its ranks'
progress (``eagleeye.agents.waits``), which tells the controller only when the host
stalls.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from collector.frames import frames_from_samples
from collector.transport import TelemetryReceiver
from collector.types import Frame, Sample, Subject
from detectors.progress import PROC_FEATURES
from detectors.types import Finding
from eagleeye.agents.hostjudge import HostJudge
from eagleeye.agents.summary import HostSummary, Reduction, summarise
from eagleeye.config import ENV_TELEMETRY, ENV_TELEMETRY_KEY
from eagleeye.detection import peer_features

#: When the raw series' file is rotated, and how many rotated files are kept.
RAW_MAX_BYTES = 64 << 20
RAW_KEEP = 4
#: What ranks report besides their steps' values (a collective they wait in, a pause, a
#: session closing, a look at /proc): kept raw on the host, never summarised.
MARKERS = frozenset({"in_collective", "closing", "pause", "job_restart"}) | PROC_FEATURES


@dataclass
class _Step:
    first: float | None = None  # when its first step report came
    values: dict[int, dict[str, float]] = field(default_factory=dict)
    subjects: dict[int, Subject] = field(default_factory=dict)
    ended: set[int] = field(default_factory=set)  # ranks whose step report (step_time) came


class HostSteps:
    """The host's ranks' steps as their frames come: a step is complete once every one of
    ``ranks`` sent its step report (``step_time``; the peer features are added then), or
    ``wait_s`` after the first rank's report of it, or once a later step is complete (a
    step that only GPU reads or late samples joined waits for its reports); then it is
    summarised and, with a ``judge``, judged
    (its findings wait in ``findings``, with their attempt, for the agent to send). A frame
    of a step already summarised (a sample that came late, a GPU's reading labelled with
    the step it was taken in) joins the next step: one summary per host and step.

    Args:
        ranks: how many ranks the host runs (``expect``).
    """

    def __init__(
        self,
        ranks: int = 0,
        wait_s: float = 2.0,
        reduction: Reduction | None = None,
        judge: HostJudge | None = None,
    ) -> None:
        self.ranks, self.wait_s = ranks, wait_s
        self.reduction = reduction or Reduction()
        self.judge = judge
        self.findings: list[tuple[int, Finding]] = []  # (attempt, finding), not yet sent
        self._steps: dict[tuple[int, int], _Step] = {}  # (attempt, step)
        self._done: dict[int, int] = {}  # attempt -> newest step summarised

    def add(self, frame: Frame, attempt: int, now: float) -> None:
        """A rank's frame of one step (others are ignored)."""
        rank, step = frame.subject.rank, frame.step
        if rank is None or step is None:
            return
        step = max(step, self._done.get(attempt, -1) + 1)
        pending = self._steps.setdefault((attempt, step), _Step())
        values = pending.values.setdefault(rank, {})
        pending.subjects[rank] = frame.subject
        if "step_time" in frame.values:  # the rank's step report: its step is complete
            values.update(peer_features({**values, **frame.values}))
            pending.ended.add(rank)
            pending.first = now if pending.first is None else pending.first
        else:
            values.update(frame.values)

    def ready(self, now: float) -> list[HostSummary]:
        """The summaries of the steps complete at ``now`` (judged too, with a judge)."""
        complete = [
            key
            for key, pending in self._steps.items()
            if len(pending.ended) >= self.ranks
            or (pending.first is not None and now - pending.first >= self.wait_s)
        ]
        # An earlier step than one complete is complete too: every rank has moved on (the
        # report a rank missed will not come), and the steps go out in order.
        newest: dict[int, int] = {}
        for attempt, step in complete:
            newest[attempt] = max(newest.get(attempt, step), step)
        done = sorted(key for key in self._steps if key[1] <= newest.get(key[0], -1))
        summaries = []
        for attempt, step in done:
            pending = self._steps.pop((attempt, step))
            self._done[attempt] = max(self._done.get(attempt, -1), step)
            summaries.append(summarise(step, attempt, pending.values, self.reduction))
            if self.judge is not None:
                found = self.judge.judge(attempt, step, pending.subjects, pending.values, now)
                self.findings += [(attempt, f) for f in found]
        if self.judge is not None:
            self.findings += [(self.judge.attempt, f) for f in self.judge.poll(now)]
        return summaries


class HostTelemetry:
    """Args:
    folder: where the raw series are kept.
    address: where the ranks send (loopback by default).
    wait_s: longest a step waits for the host's slowest rank.
    reduction: when a rank stands out against the host.
    raw_max_bytes: the size at which the raw series' file is rotated.
    raw_keep: rotated files kept (``telemetry.jsonl.1`` the newest).
    judge: the detectors run on each complete step of the host's ranks (``HostJudge``);
        None: none. Their findings wait in ``findings`` for the agent to send.
    """

    def __init__(
        self,
        folder: Path,
        address: str = "tcp://127.0.0.1",
        wait_s: float = 2.0,
        reduction: Reduction | None = None,
        clock: Callable[[], float] = time.time,
        raw_max_bytes: int = RAW_MAX_BYTES,
        raw_keep: int = RAW_KEEP,
        judge: HostJudge | None = None,
    ) -> None:
        if raw_max_bytes < 1 or raw_keep < 0:
            raise ValueError(
                f"raw_max_bytes {raw_max_bytes} and raw_keep {raw_keep}: give a size of 1 byte "
                "or more and 0 or more files to keep"
            )
        key = secrets.token_hex(32)
        self.receiver = TelemetryReceiver(address, key=key.encode())
        self.env = {ENV_TELEMETRY: self.receiver.address, ENV_TELEMETRY_KEY: key}
        self.steps = HostSteps(0, wait_s, reduction, judge)
        self.clock = clock
        self.ranks: set[str] = set()  # this host's ranks, as labels
        self.foreign = 0  # samples naming a rank that is not this host's, dropped
        folder.mkdir(parents=True, exist_ok=True)
        self.raw_path = folder / "telemetry.jsonl"
        self.raw_max_bytes = raw_max_bytes
        self.raw_keep = raw_keep
        self._raw: IO[str] = self.raw_path.open("a")
        self.marks: list[Sample] = []  # the last take's progress marks and step reports

    def expect(self, ranks: Iterable[int]) -> None:
        """The ranks this host runs now (from a launch)."""
        self.ranks = {str(rank) for rank in ranks}
        self.steps.ranks = len(self.ranks)

    def take(self) -> tuple[list[HostSummary], list[Sample]]:
        """The summaries of the steps complete now and the events that arrived."""
        samples = self.receiver.receive(timeout_s=0.0)
        own = [s for s in samples if s.labels.get("rank") in self.ranks]
        self.foreign += len(samples) - len(own)
        if own:
            self._raw.write("".join(json.dumps(s.to_json()) + "\n" for s in own))
            self._raw.flush()
            if self._raw.tell() >= self.raw_max_bytes:
                self._rotate()
        events = [s for s in own if s.step is None or s.name.startswith("event.")]
        self.marks = [s for s in own if s.name in MARKERS or s.name == "step_time"]
        now = self.clock()
        by_rank_step: dict[tuple[str, int | None], int] = {}
        for s in own:
            if s.step is not None:
                by_rank_step[(s.labels["rank"], s.step)] = int(s.labels.get("attempt", 0))
        steps = [s for s in own if s.name not in MARKERS]
        for frame in frames_from_samples(steps):
            attempt = by_rank_step.get((str(frame.subject.rank), frame.step), 0)
            self.steps.add(frame, attempt, now)
        return self.steps.ready(now), events

    def _rotate(self) -> None:
        """``telemetry.jsonl`` becomes ``.1``, ``.1`` becomes ``.2``, ...; the file past
        ``raw_keep`` is removed; a new ``telemetry.jsonl`` is opened."""
        self._raw.close()
        path = self.raw_path
        for k in range(self.raw_keep, 0, -1):
            older = path.with_name(f"{path.name}.{k}")
            if k == self.raw_keep:
                older.unlink(missing_ok=True)
            newer = path if k == 1 else path.with_name(f"{path.name}.{k - 1}")
            if newer.exists():
                newer.replace(older)
        if self.raw_keep == 0:
            path.unlink(missing_ok=True)
        self._raw = path.open("a")

    def close(self) -> None:
        self.receiver.close()
        self._raw.close()


__all__ = ["RAW_KEEP", "RAW_MAX_BYTES", "HostSteps", "HostTelemetry"]
