"""The Prometheus side of `eagleeye run`: the exporter, its HTTP server and GPU polling.

``RunMetrics.open`` binds the port first, so a busy or bad address is one clear error
before the run creates anything; ``close`` marks the run ended and keeps the final state
scrapable for ``linger_s`` seconds before the server stops.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from collector.types import Frame, Sample
from detectors.progress import ProgressStall
from detectors.types import Finding
from eagleeye.errors import EagleEyeError
from eagleeye.exporter import EagleEyeExporter
from eagleeye.gpus import GpuPolling, NvmlFactory
from eagleeye.tls import TlsFiles
from ft_runtime.layout import JobLayout
from ft_runtime.types import LifecycleEvent, Phase
from remediation.remediator import Decision, Remediator


class RunMetrics:
    """A run's exporter, served on ``address:port``.

    Args:
        exporter: the run's exporter.
        server: its HTTP server (``server_port``, ``shutdown()``).
        layout: the job's layout (a rank's GPU is its local rank on its node).
        gpus: the NVML module of each node, when GPUs are polled.
        linger_s: how long the final state stays scrapable after the run.
        say: where the linger notice goes.
    """

    def __init__(
        self,
        exporter: EagleEyeExporter,
        server: Any,
        layout: JobLayout,
        address: str,
        gpus: NvmlFactory | None = None,
        linger_s: float = 0.0,
        say: Callable[[str], None] = lambda text: print(text, file=sys.stderr),
    ) -> None:
        self.exporter = exporter
        self.server = server
        self.layout = layout
        self.address = address
        self.gpus = gpus
        self.linger_s = linger_s
        self.say = say
        self.remediator: Remediator | None = None
        self.scheme = "http"
        #: a rank -> the GPU it uses (the host's sources' map), when GPUs are read there
        self.gpu_of: Callable[[int], str] | None = None

    @classmethod
    def open(
        cls,
        run_id: str,
        layout: JobLayout,
        port: int,
        address: str = "127.0.0.1",
        gpus: NvmlFactory | None = None,
        linger_s: float = 0.0,
        tls: TlsFiles | None = None,
    ) -> RunMetrics:
        """Binds ``address:port`` (0 picks a free port) and serves the run's metrics.

        Raises:
            EagleEyeError: the port is out of range, in use, or the address is not one of
                this host's.
        """
        if not 0 <= port <= 65535:
            raise EagleEyeError(f"--metrics-port {port} is not a port; give 1-65535, or 0")
        exporter = EagleEyeExporter(run=run_id, replicas=layout.replicas)
        try:
            if tls is not None:
                tls.context()  # a bad pair is one clear error, before the server starts
            server, _ = exporter.serve(
                port,
                addr=address,
                certfile=None if tls is None else tls.cert,
                keyfile=None if tls is None else tls.key,
            )
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise EagleEyeError(
                f"cannot serve metrics on {address}:{port}: {reason}; pick a free "
                "--metrics-port (0 picks one) or another --metrics-address"
            ) from None
        metrics = cls(exporter, server, layout, address, gpus, linger_s)
        metrics.scheme = "http" if tls is None else "https"
        return metrics

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.address}:{self.server.server_port}/metrics"

    def polling(self) -> AbstractContextManager[Any]:
        """Polls the GPUs while the run lasts (nothing without an NVML source)."""
        if self.gpus is None:
            return nullcontext()
        nodes = sorted({spec.node for spec in self.layout.ranks()})
        return GpuPolling(nodes, self.gpus, self.exporter.observe_samples)

    def watch(self, detectors: list[Any]) -> None:
        """Exports each rank's progress as the job's progress detector sees it (if any)."""
        progress = next((d for d in detectors if isinstance(d, ProgressStall)), None)
        if progress is None:
            return

        def states() -> dict[str, str]:
            now = time.time()
            return {str(s.rank): v for s, v in progress.progress(now).items() if s.rank is not None}

        self.exporter.track_progress(states)

    def samples(self, samples: list[Sample]) -> None:
        self.exporter.observe_samples(samples)

    def job_step(self, frame: Frame) -> None:
        """A step of the job reduced across hosts (no rank's own samples): the steps, the
        hosts' median step time and loss."""
        if frame.step is None:
            return
        values = frame.values
        attempt = int(values.get("attempt", 0))
        step_time = values.get("step_time.median")
        self.exporter.observe_job_step(frame.step, step_time, frame.time, attempt)
        loss = values.get("loss.median")
        if loss is not None:
            labels = {"replica": "0", "attempt": str(attempt)}
            self.exporter.observe_sample(Sample("loss", loss, frame.time, labels, frame.step))

    def host_samples(self, samples: list[Sample]) -> None:
        """A host's samples (an agent forwards them): exported, and each rank's GPU, when
        a sample names it, joins the rank's info."""
        self.exporter.observe_samples(samples)
        for sample in samples:
            rank, gpu = sample.labels.get("rank", ""), sample.labels.get("gpu")
            if rank.isdigit() and gpu:
                self.exporter.observe_rank_gpu(int(rank), gpu)

    def update(self, item: object) -> None:
        """A finding, decision or lifecycle event of the run."""
        ex = self.exporter
        if isinstance(item, Finding):
            ex.observe_finding(item)
        elif isinstance(item, Decision):
            ex.observe_decision(item)
            if self.remediator is not None:
                ex.set_pending(len(self.remediator.pending()))
        elif isinstance(item, LifecycleEvent) and item.phase is Phase.LAUNCH:
            if item.subject == "job":
                ex.observe_attempt(item.attempt)
            elif item.subject.startswith("rank:"):
                rank = int(item.subject.removeprefix("rank:"))
                spec = self.layout.rank(rank)
                node = str(item.detail.get("node", spec.node))
                replica = int(item.detail.get("replica", spec.replica))
                if self.gpu_of is not None:
                    gpu = self.gpu_of(rank)
                else:
                    gpu = str(spec.local_rank) if self.gpus is not None else ""
                host = item.detail.get("host")  # the agent's host, across hosts
                ex.observe_rank(rank, node, replica, str(host) if host else None, gpu)

    def close(self) -> None:
        """Marks the run ended, keeps the final state for ``linger_s``, stops serving."""
        self.exporter.finish()
        try:
            if self.linger_s > 0:
                self.say(f"metrics stay at {self.url} for {self.linger_s:g} s (Ctrl-C ends it)")
                time.sleep(self.linger_s)
        except KeyboardInterrupt:
            pass
        finally:
            self.server.shutdown()
            self.server.server_close()
