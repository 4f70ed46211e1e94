"""Prometheus exporter of training, rank and GPU metrics and of Eagle Eye's own state.

Every series carries ``run`` (the run id; Prometheus adds ``job`` and ``instance`` from
its scrape configuration). A rank's series carry ``rank`` only; where it runs (replica,
node, hostname, GPU, UUID) is in the ``eagleeye_rank_info`` info metric, joined at query
time. GPU series use dcgm-exporter's field names and labels (``DCGM_FI_DEV_*`` with
``Hostname``, ``gpu``, ``UUID``) so that rules and dashboards written for dcgm-exporter
read them too. Samples are read in the canonical vocabulary (collector.vocabulary): any
alias (``section.data``, ``gpu_temp_c``, ...) is understood. Nothing here raises into the
controller: unknown samples are ignored.

>>> ex = EagleEyeExporter(run="r1")
>>> ex.observe_sample(Sample("step_time", 0.25, 1.0, {"rank": "3"}, step=7))
>>> b'eagleeye_rank_step_time_seconds{rank="3",run="r1"} 0.25' in ex.text()
True
"""

from __future__ import annotations

import math
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from threading import Thread
from typing import Any

import pandas as pd
import prometheus_client
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from collector.types import Sample
from collector.vocabulary import METRICS, canonical
from detectors.types import Finding, Severity
from eagleeye.goodput import STEP_COLUMNS, effective_training
from ft_runtime.types import ActionKind, OutcomeStatus
from remediation.remediator import Decision

# Counters expose ``_total`` only: a ``_created`` series per counter doubles the series
# count for a timestamp no rule or panel reads.
prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]

# Finding kinds the detectors emit; counters start at zero for them so increase() works
# from the first finding on. Other kinds get a series when first seen.
KNOWN_KINDS = (
    "process_exit",
    "hang",
    "nan",
    "slow_rank",
    "slow_node",
    "loss_spike",
    "xid",
    "collective_hang",
    "memory_leak",
    "thermal",
)
CHECKPOINT_STATES = ("pending", "cached", "backed_up", "persistent", "obsolescent", "broken")
#: What a rank is doing, as Eagle Eye's progress detector sees it (detectors/progress.py).
PROGRESS_STATES = ("stepping", "waiting", "paused", "stopped", "blocked", "closing", "unknown")
#: Finding severity -> the severity label Alertmanager and its ecosystem use.
SEVERITY_LABEL = {Severity.INFO: "info", Severity.WARN: "warning", Severity.CRITICAL: "critical"}
#: Step-time histogram buckets, seconds: 5 ms to about 82 s, doubling.
STEP_BUCKETS = tuple(0.005 * 2**i for i in range(15))
#: Canonical GPU metric -> (dcgm-exporter field, factor from our unit to dcgm's).
DCGM_FIELDS: Mapping[str, tuple[str, float]] = {
    metric.name: (alias.name, 1.0 / alias.scale)
    for metric in METRICS.values()
    if metric.scope == "gpu"
    for alias in reversed(metric.aliases)  # the first dcgm alias wins
    if alias.source == "dcgm"
}
XID_FIELD = DCGM_FIELDS["xid"][0]  # DCGM_FI_DEV_XID_ERRORS: the last XID, sticky
GPU_LABELS = ("run", "Hostname", "node", "gpu", "UUID")
_PARTS = {"step_time": "step", "data_wait_ms": "data", "comm_ms": "comm"}


class EagleEyeExporter:
    """Holds the metrics in its own registry; ``serve`` exposes them over HTTP.

    Args:
        run: the run id, the ``run`` label of every series.
        replicas: the job's replicas (the ETTR's denominator, as in the summary).
        hostname: the ``Hostname`` of GPU series (this machine's by default).
        registry: where the metrics live; a fresh one by default, so two exporters in one
            process do not collide.
        ettr_every_s: how often the ETTR is recomputed from the samples seen (it reads
            them all, so at scale less often: at most 5 % of the time); ``finish``
            computes it once more.
        clock: seconds since the epoch, for the ETTR's rate limit.
    """

    def __init__(
        self,
        run: str = "",
        replicas: int = 1,
        hostname: str | None = None,
        registry: CollectorRegistry | None = None,
        ettr_every_s: float = 2.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.run = run
        self.replicas = replicas
        self.hostname = hostname or socket.gethostname()
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self.ettr_every_s = ettr_every_s
        self.clock = clock
        self._lock = threading.RLock()
        self._parts: dict[str, tuple[int | None, dict[str, float]]] = {}
        self._rows: list[tuple[str, int, float, float, int]] = []
        self._ettr_next = -math.inf
        self._max_step = -1
        self._ckpt_state: dict[int, str] = {}
        self._ranks: dict[str, tuple[str, ...]] = {}  # rank -> its rank_info labels
        self._uuids: dict[tuple[str, str], str] = {}  # (node, gpu) -> UUID
        self._dcgm: dict[str, Gauge] = {}
        self._progress: Callable[[], Mapping[str, str]] | None = None
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        self._define()
        self._zero_series()

    def _define(self) -> None:
        r = self.registry

        def gauge(name: str, doc: str, *labels: str) -> Gauge:
            return Gauge(name, doc, ["run", *labels], registry=r)

        def counter(name: str, doc: str, *labels: str) -> Counter:
            return Counter(name, doc, ["run", *labels], registry=r)

        self.active = gauge("eagleeye_run_active", "1 while the run trains, 0 once it ended")
        self.attempt = gauge("eagleeye_run_attempt", "Attempt of the whole job (0: first)")
        self.step = gauge("eagleeye_training_step", "Last completed step", "replica")
        self.loss = gauge("eagleeye_training_loss", "Last training loss", "replica")
        self.lr = gauge("eagleeye_training_learning_rate", "Learning rate")
        self.steps = counter("eagleeye_steps", "Distinct steps the job completed")
        self.tokens = counter("eagleeye_tokens", "Tokens trained on, all ranks")
        self.step_hist = Histogram(
            "eagleeye_step_time_seconds",
            "Step time of every rank's steps",
            ["run"],
            buckets=STEP_BUCKETS,
            registry=r,
        )
        self.ettr = gauge(
            "eagleeye_ettr_ratio", "Effective training time ratio (as the summary computes it)"
        )
        self.lost = gauge(
            "eagleeye_training_lost_seconds", "Seconds of the training window not spent on steps"
        )
        self.rank_steps = counter("eagleeye_rank_steps", "Steps one rank completed", "rank")
        self.rank_last = gauge(
            "eagleeye_rank_last_step_timestamp_seconds", "When a rank last completed a step", "rank"
        )
        self.rank_step_time = gauge(
            "eagleeye_rank_step_time_seconds", "Step time of one rank", "rank"
        )
        self.rank_compute = gauge(
            "eagleeye_rank_compute_seconds",
            "Step time less data wait, collectives and checkpoint, of one rank",
            "rank",
        )
        self.rank_data_wait = gauge(
            "eagleeye_rank_data_wait_seconds", "Data-loader wait of one rank's step", "rank"
        )
        self.rank_collective_wait = gauge(
            "eagleeye_rank_collective_wait_seconds",
            "Time in collectives of one rank's step",
            "rank",
        )
        self.rank_grad_norm = gauge("eagleeye_rank_grad_norm", "Gradient norm of one rank", "rank")
        self.rank_info = gauge(
            "eagleeye_rank_info",
            "Where a rank runs (= 1; join on run, rank)",
            "rank",
            "replica",
            "node",
            "hostname",
            "gpu",
            "uuid",
        )
        self.xid_events = Counter(
            "eagleeye_gpu_xid_events", "XID events seen", [*GPU_LABELS, "xid"], registry=r
        )
        self.findings = counter("eagleeye_findings", "Findings by kind", "kind", "severity")
        self.actions = counter(
            "eagleeye_actions", "Remediation actions by kind and outcome", "kind", "status"
        )
        self.checkpoints = gauge("eagleeye_checkpoints", "Checkpoints by state", "state")
        self.checkpoint_step = gauge(
            "eagleeye_checkpoint_last_step", "Step of the newest checkpoint"
        )
        self.restores = counter("eagleeye_checkpoint_restores", "Restores by tier", "tier")
        self.pending = gauge("eagleeye_pending_approvals", "Actions waiting for approval")

    def _zero_series(self) -> None:
        run = self.run
        self.active.labels(run).set(1)
        self.attempt.labels(run).set(0)
        self.steps.labels(run)
        self.tokens.labels(run)
        self.pending.labels(run).set(0)
        for kind in KNOWN_KINDS:
            for severity in SEVERITY_LABEL.values():
                self.findings.labels(run, kind, severity)
        for action in ActionKind:
            for status in OutcomeStatus:
                self.actions.labels(run, action.value, status.value)
        for state in CHECKPOINT_STATES:
            self.checkpoints.labels(run, state).set(0)

    def observe_sample(self, sample: Sample) -> None:
        """Updates the metrics a sample feeds (never raises on what it does not know)."""
        with self._lock:
            self._observe(sample)
            rank = sample.labels.get("rank")
            if rank is not None:
                self._split(rank)
            self._maybe_ettr()

    def observe_samples(self, samples: Iterable[Sample]) -> None:
        with self._lock:
            touched = set()
            for sample in samples:
                self._observe(sample)
                if "rank" in sample.labels:
                    touched.add(sample.labels["rank"])
            for rank in touched:
                self._split(rank)
            self._maybe_ettr()

    def _of(self, metric: Any, *labels: str) -> Any:
        """The run's child of ``metric`` for ``labels``, cached (labels() is the hot path)."""
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = metric.labels(self.run, *labels)
            self._children[key] = child
        return child

    def _observe(self, sample: Sample) -> None:
        labels = sample.labels
        if sample.name == "event.checkpoint":
            self._checkpoint(sample)
            return
        if sample.name == "event.restore":
            self._of(self.restores, labels.get("tier", "disk")).inc()
            return
        name, value = canonical(sample.name, sample.value)
        if not math.isfinite(value) and name != "loss":
            return
        replica = labels.get("replica", "0")
        rank = labels.get("rank")
        if name == "loss":
            self._of(self.loss, replica).set(value)
            if sample.step is not None:
                self._of(self.step, replica).set(sample.step)
        elif name == "lr":
            self._of(self.lr).set(value)
        elif name == "tokens":
            self._of(self.tokens).inc(max(value, 0.0))
        elif name == "xid" and "gpu" in labels:
            self.observe_xid(labels.get("node", ""), labels["gpu"], int(value), labels)
        elif name in DCGM_FIELDS and "gpu" in labels:
            self._gpu(name, value, labels)
        elif rank is None:
            return
        elif name == "grad_norm":
            self._of(self.rank_grad_norm, rank).set(value)
        elif name == "replicas" and sample.step is not None:
            self._rows.append(("replicas", sample.step, value, sample.time, _attempt(labels)))
        elif name in _PARTS or name == "section.checkpoint":
            self._part(rank, sample.step, _PARTS.get(name, "checkpoint"), name, value)
            if name == "step_time":
                self._stepped(sample, rank, value)

    def _stepped(self, sample: Sample, rank: str, seconds: float) -> None:
        self._of(self.rank_steps, rank).inc()
        self._of(self.rank_last, rank).set(sample.time)
        self._of(self.step_hist).observe(seconds)
        if sample.step is not None:
            if sample.step > self._max_step:
                self._of(self.steps).inc()
                self._max_step = sample.step
            self._rows.append(
                ("step_time", sample.step, seconds, sample.time, _attempt(sample.labels))
            )

    def _part(self, rank: str, step: int | None, part: str, name: str, value: float) -> None:
        seen = self._parts.get(rank)
        if seen is None or seen[0] != step:
            seen = (step, {})
            self._parts[rank] = seen
        metric = METRICS.get(name)
        seen[1][part] = metric.to_base(value) if metric is not None else value

    def _split(self, rank: str) -> None:
        """Step, compute, data-wait and collective-wait seconds of the rank's newest step."""
        seen = self._parts.get(rank)
        if seen is None or "step" not in seen[1]:
            return
        parts = seen[1]
        waits = parts.get("data", 0.0) + parts.get("comm", 0.0) + parts.get("checkpoint", 0.0)
        self._of(self.rank_step_time, rank).set(parts["step"])
        self._of(self.rank_data_wait, rank).set(parts.get("data", 0.0))
        self._of(self.rank_collective_wait, rank).set(parts.get("comm", 0.0))
        self._of(self.rank_compute, rank).set(max(parts["step"] - waits, 0.0))

    def _gauge(self, field: str, help_text: str) -> Gauge:
        gauge = self._dcgm.get(field)
        if gauge is None:
            gauge = Gauge(field, help_text, list(GPU_LABELS), registry=self.registry)
            self._dcgm[field] = gauge
        return gauge

    def _gpu(self, name: str, value: float, labels: Mapping[str, str]) -> None:
        field, factor = DCGM_FIELDS[name]
        self._gauge(field, METRICS[name].help).labels(*self._gpu_labels(labels)).set(value * factor)

    def _gpu_labels(self, labels: Mapping[str, str]) -> tuple[str, ...]:
        """The GPU's labels; a GPU seen first gets its sticky XID gauge at 0, so that its
        first XID is a change (rules alert on changes of it)."""
        node, gpu = labels.get("node", ""), labels.get("gpu", "")
        known = self._uuids.get((node, gpu))
        uuid = labels.get("uuid") or labels.get("UUID") or known or ""
        host = labels.get("Hostname") or labels.get("host") or self.hostname
        key = (self.run, host, node, gpu, uuid)
        if known is None or known != uuid:
            self._uuids[(node, gpu)] = uuid
            self._refresh_ranks(node, gpu)
            self._gauge(XID_FIELD, METRICS["xid"].help).labels(*key).set(0)
        return key

    def observe_rank(
        self, rank: int, node: str, replica: int, hostname: str | None = None, gpu: str = ""
    ) -> None:
        """Where a rank runs (at each launch); its GPU's UUID comes from the GPU metrics."""
        with self._lock:
            key = str(rank)
            uuid = self._uuids.get((node, gpu), "")
            labels = (self.run, key, str(replica), node, hostname or self.hostname, gpu, uuid)
            old = self._ranks.get(key)
            if old == labels:
                return
            if old is not None:
                self.rank_info.remove(*old)
            self._ranks[key] = labels
            self.rank_info.labels(*labels).set(1)

    def observe_rank_gpu(self, rank: int, gpu: str) -> None:
        """The GPU a rank uses, learnt after its launch (a host's samples name it)."""
        with self._lock:
            old = self._ranks.get(str(rank))
            if old is not None and old[5] != gpu:
                self.observe_rank(rank, old[3], int(old[2]), old[4], gpu)

    def observe_job_step(
        self, step: int, seconds: float | None, when: float, attempt: int = 0
    ) -> None:
        """A step of the whole job, from telemetry reduced on the hosts (no rank's own
        samples): the steps counter, the step-time histogram, the ETTR's rows."""
        with self._lock:
            if step > self._max_step:
                self._of(self.steps).inc()
                self._max_step = step
            if seconds is not None and math.isfinite(seconds):
                self._of(self.step_hist).observe(seconds)
                self._rows.append(("step_time", step, seconds, when, attempt))
            self._maybe_ettr()

    def _refresh_ranks(self, node: str, gpu: str) -> None:
        for labels in list(self._ranks.values()):
            if (labels[3], labels[5]) == (node, gpu):
                self.observe_rank(int(labels[1]), node, int(labels[2]), labels[4], gpu)

    def observe_xid(
        self, node: str, gpu: str, xid: int, labels: Mapping[str, str] | None = None
    ) -> None:
        """One XID event: the sticky last-XID gauge (dcgm's name) and the event counter."""
        with self._lock:
            where = {"node": node, "gpu": gpu, **(labels or {})}
            if xid != 0:
                self.xid_events.labels(*self._gpu_labels(where), str(xid)).inc()
            self._gpu("xid", float(xid), where)

    def observe_finding(self, finding: Finding) -> None:
        self.findings.labels(self.run, finding.kind, SEVERITY_LABEL[finding.severity]).inc()

    def observe_decision(self, decision: Decision) -> None:
        outcome = decision.outcome
        if not outcome.final:  # counted once, by what became of it
            return
        self.actions.labels(self.run, outcome.action.kind.value, outcome.status.value).inc()

    def observe_attempt(self, attempt: int) -> None:
        self.attempt.labels(self.run).set(attempt)

    def set_pending(self, count: int) -> None:
        self.pending.labels(self.run).set(count)

    def _checkpoint(self, sample: Sample) -> None:
        step = int(sample.value)
        memory = sample.labels.get("tier", "disk") == "memory"
        state = "cached" if memory and self._ckpt_state.get(step) != "persistent" else "persistent"
        self._ckpt_state[step] = state
        self.checkpoint_step.labels(self.run).set(max(self._ckpt_state))
        counts: dict[str, int] = {}
        for value in self._ckpt_state.values():
            counts[value] = counts.get(value, 0) + 1
        self.set_checkpoint_states(counts)

    def set_checkpoint_states(self, counts: Mapping[str, int]) -> None:
        for state in CHECKPOINT_STATES:
            self.checkpoints.labels(self.run, state).set(counts.get(state, 0))

    def _maybe_ettr(self, force: bool = False) -> None:
        """Recomputes the ETTR when due: every ``ettr_every_s``, or less often when it takes
        long (at most 5 % of the time: it reads every step sample seen)."""
        now = self.clock()
        if not force and now < self._ettr_next:
            return
        started = time.perf_counter()
        table = pd.DataFrame(self._rows, columns=list(STEP_COLUMNS))
        ettr, lost = effective_training(table, self.replicas)
        if math.isfinite(ettr):
            self._of(self.ettr).set(ettr)
            self._of(self.lost).set(lost)
        took = time.perf_counter() - started
        self._ettr_next = now + max(self.ettr_every_s, 20 * took)

    def track_progress(self, states: Callable[[], Mapping[str, str]]) -> None:
        """Exports ``eagleeye_rank_progress{rank, state}`` = 1, read from ``states`` (rank
        -> one of PROGRESS_STATES) at each scrape, so a hang names the rank that stopped."""
        if self._progress is None:
            self.registry.register(_ProgressCollector(self))
        self._progress = states

    def progress_states(self) -> dict[str, str]:
        """Each rank's progress state now (empty once the run ended or when not tracked)."""
        states = self._progress
        if states is None:
            return {}
        for _ in range(3):  # the detector's thread may change its ranks as we read them
            try:
                return dict(states())
            except RuntimeError:
                continue
        return {}

    def finish(self) -> None:
        """The run ended: ``eagleeye_run_active`` 0 and the final ETTR (what lingers); the
        ranks' progress is no longer reported."""
        with self._lock:
            self._maybe_ettr(force=True)  # first: a scrape that sees the end sees its ETTR
            self.active.labels(self.run).set(0)
            self._progress = (lambda: {}) if self._progress is not None else None

    def text(self) -> bytes:
        """The exposition text (what ``/metrics`` serves)."""
        return generate_latest(self.registry)

    def serve(
        self,
        port: int = 0,
        addr: str = "127.0.0.1",
        certfile: str | None = None,
        keyfile: str | None = None,
    ) -> tuple[Any, Thread]:
        """Serves ``/metrics`` on ``addr:port`` (loopback by default; 0 picks a port), over
        HTTPS when a certificate and its key are given.

        Returns the server (``server.server_port``, ``server.shutdown()``) and its thread.

        Raises:
            OSError: the address cannot be bound (in use, not an address of this host).
        """
        server, thread = start_http_server(
            port, addr=addr, registry=self.registry, certfile=certfile, keyfile=keyfile
        )
        return server, thread


class _ProgressCollector(Collector):
    def __init__(self, exporter: EagleEyeExporter) -> None:
        self.exporter = exporter

    def describe(self) -> list[GaugeMetricFamily]:
        return [self._family()]

    def collect(self) -> list[GaugeMetricFamily]:
        family = self._family()
        for rank, state in sorted(self.exporter.progress_states().items()):
            family.add_metric([self.exporter.run, rank, state], 1.0)
        return [family]

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "eagleeye_rank_progress",
            "What a rank is doing (= 1 for its state): " + ", ".join(PROGRESS_STATES),
            labels=["run", "rank", "state"],
        )


def _attempt(labels: Mapping[str, str]) -> int:
    text = labels.get("attempt", "0")
    return int(text) if text.isdigit() else 0
