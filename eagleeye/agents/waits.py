"""A rank blocked while its peers wait in a collective, across hosts: its host's agent
reports the ranks' progress when the host stalls, the controller judges.

On its host, the agent follows each rank's progress from the telemetry it already
receives (``RankProgress``): a completed step (``step_time``), a collective the rank
waits in (``in_collective`` > 0, sent by the hook once a collective stays open 0.1 s;
0 when the wait ends), a declared pause (``pause`` 1 ... 0: validation, a checkpoint
save) and the end of training (``closing``). It tells the controller nothing while its
ranks make progress. Once one of them has made none (no step completed, no wait or
pause ended) for half the controller's silence limit (``REPORT_AT`` of ``k`` median
step times, at least ``min_silence_s``: the ``--hang-k`` and ``--hang-min-silence-s``
limits the launch carries), the host stalls, and the agent sends one ``progress``
report: a sample per live rank, named by its state (``progress.waiting``,
``progress.paused``, ``progress.running``, ``progress.closing``), valued by the seconds
it has made no progress, with its last completed step. While the stall lasts it sends the
states again only when one changes, and once more when the stall is over. With a rank
reported running it sends a look at the rank's process (``/proc``, its main thread, as
``eagleeye run`` looks): ``proc_cpu_s``, the CPU time the thread has run, and
``proc_blocked`` (1 in uninterruptible sleep, state ``D``); again when either changes, at
most once a second (``REPEAT_S``) a rank. A job in health sends nothing.

The controller (``CollectiveWaitHang``) judges on that evidence, never on silence alone.
When no step of the job has completed for the silence limit (``k`` median step times of
the job, at least ``min_silence_s``, on the controller's clock), ranks report that they
wait in a collective, and ranks reported running (neither waiting, nor paused, nor
closing) have stayed so for the limit, such a rank is the one the others wait for only on
the evidence of its process, by ``eagleeye run``'s rule (``detectors.progress``): its main
thread has gained no CPU time for ``idle_s`` (and the silence limit), or it has stayed in
uninterruptible sleep without CPU time for ``blocked_s``. A busy rank (a checkpoint save,
an evaluation not declared as a pause) is working, however long; a rank whose process
its host cannot look at is never a culprit. Then one critical ``hang`` on the culprits
(one rank with its node; several: their node, else the job), with their seconds idle or
blocked and CPU seconds, the waiting ranks in its evidence. A job that waits whole (every
rank waiting) is reported (a ``collective_stall`` warning, no action); a job where nobody
waits (every rank paused, or no collective reported) draws nothing. A paused rank is
never a culprit, and a pause or a wait that ends is progress: a rank is running only from
when it was last seen to leave one. A rank reported stopped (``proc_stopped``) is
``StoppedRankHang``'s: no verdict here while one is. Before the job's first step nothing
is judged. Times are the controller's: a report and a look count from when they arrive
(their seconds are evidence only).
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from collector.types import JOB, Frame, Sample, Subject
from detectors._liveness import RankLiveness
from detectors.progress import HangLimits, culprit_subject
from detectors.types import Finding, Severity
from ft_runtime import procstat

#: Samples of a rank's progress state: ``progress.<state>``.
PREFIX = "progress."
STATES = ("running", "waiting", "paused", "closing")
#: The agent reports once a rank has made no progress for this share of the limit.
REPORT_AT = 0.5
#: The looks at a running rank's process the agent sends (``eagleeye run``'s names).
LOOKS = ("proc_cpu_s", "proc_blocked")
#: While a stall lasts, a running rank's look is sent again on a change, at most this often.
REPEAT_S = 1.0
_LISTED = 8  # ranks named one by one in a finding's evidence


def limits_body(limits: HangLimits) -> dict[str, float]:
    """What a launch carries to the agents: the limits their reports are timed from."""
    return {"k": limits.k, "min_silence_s": limits.min_silence_s}


def silence_limit(limits: HangLimits, step_times: Sequence[float]) -> float | None:
    """``k`` median step times, at least ``min_silence_s``; None before any step."""
    if not step_times:
        return None
    return max(limits.k * statistics.median(step_times), limits.min_silence_s)


@dataclass
class _Progress:
    last: float  # when it last made progress (launch, step, end of a wait or a pause)
    step: int | None = None
    waiting: bool = False
    paused: bool = False
    closing: bool = False

    def state(self) -> str:
        if self.closing:
            return "closing"
        if self.paused:
            return "paused"
        return "waiting" if self.waiting else "running"


class RankProgress:
    """The agent's view of its ranks' progress in one attempt; reports on a stall.

    Args:
        node: the host's node (``nodeN``), as the samples name it.
        attempt: the attempt its ranks run.
        ranks: the host's ranks.
        limits: the controller's ``k`` and ``min_silence_s``.
        now: when the ranks were launched (the agent's clock).
    """

    def __init__(
        self, node: str, attempt: int, ranks: Iterable[int], limits: HangLimits, now: float
    ) -> None:
        self.node, self.attempt, self.limits = node, attempt, limits
        self._ranks = {rank: _Progress(now) for rank in ranks}
        self._step_times: deque[float] = deque(maxlen=64)
        self._told: dict[int, tuple[str, int | None]] = {}  # what the controller last got
        self._looked: dict[int, tuple[float, float, float]] = {}  # rank → when, cpu, D told
        self.reports = 0  # progress reports made (each one message)

    def observe(self, samples: Iterable[Sample], now: float) -> None:
        """The host's ranks' samples as they arrive (other ranks' and attempts' ignored)."""
        for sample in samples:
            rank = sample.labels.get("rank", "")
            held = self._ranks.get(int(rank)) if rank.isascii() and rank.isdigit() else None
            if held is None or sample.labels.get("attempt", "0") != str(self.attempt):
                continue
            name, value = sample.name, sample.value
            if name == "step_time":
                held.last, held.waiting = now, False
                held.step = sample.step if sample.step is not None else held.step
                if value > 0:
                    self._step_times.append(value)
            elif name == "in_collective":
                if value <= 0 and held.waiting:
                    held.last = now  # the wait is over: progress
                held.waiting = value > 0
            elif name == "pause":
                if value <= 0 and held.paused:
                    held.last = now
                held.paused = value > 0
            elif name == "closing":
                held.closing = True

    def bound_s(self) -> float | None:
        """How long a rank makes no progress before its host reports (None: no step yet)."""
        limit = silence_limit(self.limits, self._step_times)
        return None if limit is None else REPORT_AT * limit

    def report(
        self, now: float, live: Iterable[int], pids: Mapping[int, int] | None = None
    ) -> list[Sample]:
        """The live ranks' states when the host stalls, changes during a stall, or the
        stall's end; during a stall, looks at the processes (``pids``: rank → pid) of the
        ranks running; nothing otherwise."""
        bound = self.bound_s()
        ranks = {r: self._ranks[r] for r in sorted(live) if r in self._ranks}
        if bound is None or not ranks:
            return []
        # a rank that has not stepped in this attempt is starting: no stall of its own
        stalled = any(now - held.last >= bound for held in ranks.values() if held.step is not None)
        states = {r: (held.state(), held.step) for r, held in ranks.items()}
        labels = {
            r: {"rank": str(r), "node": self.node, "attempt": str(self.attempt)} for r in ranks
        }
        if stalled:
            looks = self._look(now, states, pids or {}, labels)
            if states == self._told:
                if looks:
                    self.reports += 1
                return looks
            self._told = states
        elif self._told:
            self._told, self._looked = {}, {}  # the stall is over: said once
            looks = []
        else:
            return []
        self.reports += 1
        told = [
            Sample(PREFIX + state, round(now - ranks[rank].last, 3), now, labels[rank], step)
            for rank, (state, step) in states.items()
        ]
        return told + looks

    def _look(
        self,
        now: float,
        states: Mapping[int, tuple[str, int | None]],
        pids: Mapping[int, int],
        labels: Mapping[int, dict[str, str]],
    ) -> list[Sample]:
        """The running ranks' main threads (CPU time, state D), when new to the controller."""
        out: list[Sample] = []
        for rank, (state, step) in states.items():
            if state != "running" or rank not in pids:
                self._looked.pop(rank, None)
                continue
            look = procstat.sample(pids[rank])
            if look is None:
                continue  # nothing known: no evidence either way
            cpu, blocked = look.cpu_ns / 1e9, float(look.state == "D")
            told = self._looked.get(rank)
            if told is not None and (told[1:] == (cpu, blocked) or now - told[0] < REPEAT_S):
                continue
            self._looked[rank] = (now, cpu, blocked)
            values = zip(LOOKS, (cpu, blocked), strict=True)
            out += [Sample(n, v, now, labels[rank], step) for n, v in values]
        return out


@dataclass
class _Reported:
    state: str
    step: int | None
    since: float  # when the controller learnt the rank entered this state
    subject: Subject
    silent_s: float  # the agent's word: seconds without progress when it reported
    live: RankLiveness = field(init=False)  # a running rank's process: CPU time, state D

    def __post_init__(self) -> None:
        self.live = RankLiveness(self.since)


class CollectiveWaitHang:
    """The controller's judgement of the ranks' progress its agents report (one attempt).

    Args:
        world_size: the job's ranks.
        limits: ``k``, ``min_silence_s``, ``idle_s`` and ``blocked_s`` (``eagleeye
            controller --hang-k ...``).
    """

    name = "collective_wait"

    def __init__(self, world_size: int, limits: HangLimits | None = None) -> None:
        self.world_size = world_size
        self.limits = limits or HangLimits()
        self._states: dict[int, _Reported] = {}
        self._stopped: set[int] = set()
        self._gone: set[int] = set()  # ranks of the attempt that exited
        self._step_times: deque[float] = deque(maxlen=32)
        self._progress: float | None = None  # when the job's newest step arrived
        self._newest: int | None = None
        self._fired = False  # one verdict per stall
        self._reported = False  # one report of a job that waits whole, per stall

    def observe(self, samples: Iterable[Sample], attempt: int, now: float) -> None:
        """The agents' progress reports and looks at /proc, as they arrive (those of other
        attempts than ``attempt`` are of processes that are gone)."""
        for sample in samples:
            rank = _job_rank(sample.labels.get("rank", ""), self.world_size)
            if rank is None or sample.labels.get("attempt") != str(attempt):
                continue  # no rank of this job (an agent's word on nobody it runs)
            if sample.name == "proc_stopped":
                (self._stopped.add if sample.value > 0 else self._stopped.discard)(rank)
            elif sample.name.startswith(PREFIX) and sample.name[len(PREFIX) :] in STATES:
                self._report(rank, sample, now)
            elif sample.name in LOOKS:
                self._look(rank, sample, now)

    def _look(self, rank: int, sample: Sample, now: float) -> None:
        """A look at a running rank's process: when its CPU time last grew, state D."""
        held = self._states.get(rank)
        if held is None or held.state != "running" or held.step != sample.step:
            return  # a look of another spell of the rank: not this one's evidence
        held.live.update({sample.name: sample.value}, now, None)

    def _report(self, rank: int, sample: Sample, now: float) -> None:
        newest = self._newest
        if sample.step is not None and newest is not None and sample.step < newest:
            return  # the job went on since: a stale word
        state = sample.name[len(PREFIX) :]
        held = self._states.get(rank)
        if held is not None and held.state == state:
            held.step, held.silent_s = sample.step, sample.value
            return
        # a first word counts from the job's last step; a change from when it arrives
        since = now if held is not None or self._progress is None else self._progress
        subject = Subject(rank=rank, node=sample.labels.get("node") or None)
        self._states[rank] = _Reported(state, sample.step, since, subject, sample.value)

    def exited(self, rank: int) -> None:
        """A rank of the attempt ended: it waits for nobody and nobody for it here."""
        self._gone.add(rank)
        self._states.pop(rank, None)

    def job_step(self, frame: Frame, now: float) -> None:
        """The job's frame of a step (the hosts' summaries reduced): progress."""
        if frame.step is None or (self._newest is not None and frame.step <= self._newest):
            return
        self._newest, self._progress = frame.step, now
        self._fired = self._reported = False
        step_time = frame.values.get("step_time.median")
        if step_time is not None and step_time > 0:
            self._step_times.append(step_time)
        stale = [r for r, s in self._states.items() if s.step is None or s.step < frame.step]
        for rank in stale:  # each went past the step it reported
            del self._states[rank]

    def limit_s(self) -> float | None:
        return silence_limit(self.limits, self._step_times)

    def poll(self, now: float) -> list[Finding]:
        limit = self.limit_s()
        if self._progress is None or limit is None or self._fired or self._stopped:
            return []
        still = now - self._progress
        if still < limit:
            return []
        by_state: dict[str, list[int]] = {state: [] for state in STATES}
        for rank, held in sorted(self._states.items()):
            by_state[held.state].append(rank)
        waiting = by_state["waiting"]
        if not waiting:
            return []  # nobody waits: paused, closing, or no collective reported
        culprits = self._culprits(by_state["running"], limit, now)
        evidence = {
            "silence_s": still,
            "limit_s": limit,
            "ranks_waiting": float(len(waiting)),
            "ranks_unknown": float(self.world_size - len(self._gone) - len(self._states)),
            **_listed("waiting_rank", waiting),
        }
        if self._newest is not None:
            evidence["last_step"] = float(self._newest)
        step = None if self._newest is None else self._newest + 1
        if culprits:
            self._fired = True
            evidence |= self._evidence(culprits, limit, now)
            subjects = [self._states[r].subject for r in sorted(culprits)]
            live = self.world_size - len(self._gone)
            subject = culprit_subject(subjects, live)
            score = max(held / floor for _, held, floor in culprits.values())
            return [
                Finding("hang", subject, score, Severity.CRITICAL, now, step, evidence, self.name)
            ]
        if len(waiting) == self.world_size - len(self._gone) and not self._reported:
            self._reported = True  # the job waits whole: reported, and nothing acts
            evidence["collective_stall"] = 1.0
            finding = Finding(
                "collective_stall", JOB, still / limit, Severity.WARN, now, step, evidence,
                self.name,
            )  # fmt: skip
            return [finding]
        return []

    def _culprits(
        self, running: Sequence[int], limit: float, now: float
    ) -> dict[int, tuple[str, float, float]]:
        """The running ranks the others wait for, by ``eagleeye run``'s rule: rank →
        (``idle`` or ``blocked``, for how long, its limit). Held running for the silence
        limit, and its main thread without CPU time for ``idle_s`` (at least that limit),
        or in state D without CPU time for ``blocked_s``; a busy rank is working."""
        assert self._progress is not None
        idle_floor = max(self.limits.idle_s, limit)  # as detectors.progress: at least k steps
        out: dict[int, tuple[str, float, float]] = {}
        for rank in running:
            held = self._states[rank]
            if now - max(held.since, self._progress) < limit:
                continue
            blocked, idle = held.live.blocked_for(now), held.live.idle_for(now)
            if blocked >= self.limits.blocked_s:
                out[rank] = ("blocked", blocked, self.limits.blocked_s)
            elif idle >= idle_floor:
                out[rank] = ("idle", idle, idle_floor)
        return out

    def _evidence(
        self, culprits: Mapping[int, tuple[str, float, float]], limit: float, now: float
    ) -> dict[str, float]:
        """Why each culprit is one: seconds idle or blocked, its CPU seconds, the limits."""
        assert self._progress is not None
        named = sorted(culprits)
        evidence = {"collective_wait": 1.0, **_listed("culprit_rank", named)}
        for reason in ("idle", "blocked"):
            mine = [(d, floor) for why, d, floor in culprits.values() if why == reason]
            if mine:
                evidence |= {reason: 1.0, f"{reason}_s": max(d for d, _ in mine)}
                evidence[f"{reason}_limit_s"] = mine[0][1]
        evidence["culprit_held_s"] = max(
            now - max(self._states[r].since, self._progress) for r in named
        )
        for i, rank in enumerate(named[:_LISTED]):
            told = self._states[rank]
            evidence[f"culprit_silent_s_{i}"] = told.silent_s
            evidence[f"culprit_idle_s_{i}"] = told.live.idle_for(now)
            evidence[f"culprit_cpu_s_{i}"] = told.live.cpu or 0.0
        return evidence


def _job_rank(label: str, world_size: int) -> int | None:
    """The rank a sample's label names, when it is one of the job's (ASCII digits only:
    ``"²".isdigit()`` holds, yet ``int`` refuses it)."""
    if not (label.isascii() and label.isdigit()):
        return None
    rank = int(label)
    return rank if rank < world_size else None


def _listed(prefix: str, ranks: Sequence[int]) -> dict[str, float]:
    return {f"{prefix}_{i}": float(rank) for i, rank in enumerate(sorted(ranks)[:_LISTED])}


__all__ = [
    "LOOKS",
    "PREFIX",
    "REPEAT_S",
    "REPORT_AT",
    "STATES",
    "CollectiveWaitHang",
    "RankProgress",
    "limits_body",
    "silence_limit",
]
