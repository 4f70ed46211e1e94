"""Prometheus exporter of training, rank and GPU metrics and of Eagle Eye's own state.

Labels stay low-cardinality: a rank's series carry only ``rank`` (its node and replica are
in the ``eagleeye_rank_info`` info metric, joined at query time), GPU series carry
``node`` and ``gpu``, and Eagle Eye's counters carry a finding or action kind and a
status. Nothing here raises into the controller: unknown samples are ignored.

>>> ex = EagleEyeExporter()
>>> ex.observe_sample(Sample("step_time", 0.25, 1.0, {"rank": "3"}, step=7))
>>> b"eagleeye_rank_step_time_seconds" in ex.text()
True
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from threading import Thread
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest, start_http_server

from collector.types import Sample
from detectors.types import Finding, Severity
from ft_runtime.types import ActionKind, OutcomeStatus
from remediation.remediator import Decision

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
# Per-rank sample name -> (metric, unit scale).
_RANK = {"step_time": "step_time", "data_wait": "data_wait", "grad_norm": "grad_norm"}
_GPU = {
    "gpu_util": "eagleeye_gpu_utilization_ratio",
    "gpu_temp": "eagleeye_gpu_temperature_celsius",
    "gpu_power": "eagleeye_gpu_power_watts",
    "gpu_mem_used": "eagleeye_gpu_memory_used_bytes",
}


class EagleEyeExporter:
    """Holds the metrics in its own registry; ``serve`` exposes them over HTTP.

    Args:
        registry: where the metrics live; a fresh one by default, so two exporters in one
            process do not collide.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self.step = Gauge("eagleeye_training_step", "Last completed step", ["replica"], registry=r)
        self.loss = Gauge("eagleeye_training_loss", "Last training loss", ["replica"], registry=r)
        self.lr = Gauge("eagleeye_training_learning_rate", "Learning rate", registry=r)
        self.rank_step_time = Gauge(
            "eagleeye_rank_step_time_seconds", "Step time of one rank", ["rank"], registry=r
        )
        self.rank_data_wait = Gauge(
            "eagleeye_rank_data_wait_seconds", "Data-loader wait of one rank", ["rank"], registry=r
        )
        self.rank_grad_norm = Gauge(
            "eagleeye_rank_grad_norm", "Gradient norm seen by one rank", ["rank"], registry=r
        )
        self.rank_info = Gauge(
            "eagleeye_rank_info", "Where a rank runs", ["rank", "node", "replica"], registry=r
        )
        self.gpu = {
            name: Gauge(metric, f"GPU {name}", ["node", "gpu"], registry=r)
            for name, metric in _GPU.items()
        }
        self.xid_last = Gauge(
            "eagleeye_gpu_xid_last",
            "Last XID of a GPU (sticky: alert on changes(), not on its value)",
            ["node", "gpu"],
            registry=r,
        )
        self.xid_events = Counter(
            "eagleeye_gpu_xid_events", "XID events seen", ["node", "gpu"], registry=r
        )
        self.findings = Counter(
            "eagleeye_findings", "Findings by kind", ["kind", "severity"], registry=r
        )
        self.actions = Counter(
            "eagleeye_actions",
            "Remediation actions by kind and outcome",
            ["kind", "status"],
            registry=r,
        )
        self.checkpoints = Gauge(
            "eagleeye_checkpoints", "Checkpoints by state", ["state"], registry=r
        )
        self.pending = Gauge(
            "eagleeye_pending_approvals", "Actions waiting for approval", registry=r
        )
        self._zero_series()

    def _zero_series(self) -> None:
        for kind in KNOWN_KINDS:
            for severity in Severity:
                self.findings.labels(kind, severity.value)
        for action in ActionKind:
            for status in OutcomeStatus:
                self.actions.labels(action.value, status.value)
        for state in CHECKPOINT_STATES:
            self.checkpoints.labels(state).set(0)

    def observe_sample(self, sample: Sample) -> None:
        """Updates the metric a sample feeds (step, loss, lr, per-rank and GPU values)."""
        labels, value = sample.labels, sample.value
        if not math.isfinite(value) and sample.name != "loss":
            return
        replica = labels.get("replica", "0")
        if sample.name == "loss":
            self.loss.labels(replica).set(value)
            if sample.step is not None:
                self.step.labels(replica).set(sample.step)
        elif sample.name == "lr":
            self.lr.set(value)
        elif sample.name in _RANK and "rank" in labels:
            getattr(self, f"rank_{_RANK[sample.name]}").labels(labels["rank"]).set(value)
        elif sample.name in _GPU:
            self.gpu[sample.name].labels(labels.get("node", ""), labels.get("gpu", "")).set(value)
        elif sample.name == "xid":
            self.observe_xid(labels.get("node", ""), labels.get("gpu", ""), int(value))

    def observe_samples(self, samples: Iterable[Sample]) -> None:
        for sample in samples:
            self.observe_sample(sample)

    def observe_rank(self, rank: int, node: str, replica: int) -> None:
        self.rank_info.labels(str(rank), node, str(replica)).set(1)

    def observe_xid(self, node: str, gpu: str, xid: int) -> None:
        """One XID event: the sticky last-value gauge and the event counter."""
        self.xid_last.labels(node, gpu).set(xid)
        self.xid_events.labels(node, gpu).inc()

    def observe_finding(self, finding: Finding) -> None:
        self.findings.labels(finding.kind, finding.severity.value).inc()

    def observe_decision(self, decision: Decision) -> None:
        outcome = decision.outcome
        self.actions.labels(outcome.action.kind.value, outcome.status.value).inc()

    def set_checkpoint_states(self, counts: Mapping[str, int]) -> None:
        for state in CHECKPOINT_STATES:
            self.checkpoints.labels(state).set(counts.get(state, 0))

    def text(self) -> bytes:
        """The exposition text (what ``/metrics`` serves)."""
        return generate_latest(self.registry)

    def serve(self, port: int = 0, addr: str = "127.0.0.1") -> tuple[Any, Thread]:
        """Serves ``/metrics`` on ``addr:port`` (loopback by default; 0 picks a port).

        Returns the server (``server.server_port``, ``server.shutdown()``) and its thread.
        """
        server, thread = start_http_server(port, addr=addr, registry=self.registry)
        return server, thread
