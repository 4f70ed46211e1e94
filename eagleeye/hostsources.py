"""The host's own sources in a live run: its GPUs, its kernel log, NCCL dumps, its counters.

``HostSources`` polls, every ``every_s`` seconds on a background thread, what the host
offers: NVML (when a GPU is there, or the fake NVML in tests), a dcgm-exporter URL, the
kernel log (XID lines), a folder of NCCL flight-recorder dumps and the host's CPU, memory,
disk and NIC counters. Every sample is labelled with the real hostname (``host``) and the
source it came from (``source``); a GPU's samples also name the rank that uses it.

Which rank uses a GPU: the ranks of a node that read one NVML (or the host's
dcgm-exporter) use its GPUs as torchrun's ranks do, local rank ``p`` the ``p``-th device of
``CUDA_VISIBLE_DEVICES`` (an index or a UUID), or GPU ``p`` when it is not set. On one
machine the virtual nodes of a job share its GPUs: a GPU used by several ranks is
labelled with the lowest of them.

The controller takes the samples (``take``) on its own thread, stores them, exports them
and turns them into frames for the host rules (``host_frames``): a fatal XID, an ECC error,
a thermal throttle become findings on the rank (or node) they concern.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from collector.exporter import ExporterSource
from collector.frames import subject_of
from collector.types import Frame, Sample, Subject
from collector.vocabulary import canonical_values
from ft_runtime.layout import JobLayout, RankSpec

log = logging.getLogger(__name__)

#: node name -> the NVML module (pynvml or a fake) its ranks' GPUs are read through.
NvmlFactory = Callable[[str], Any]

LABEL_HOST = "host"
LABEL_SOURCE = "source"
#: The marker every host frame carries: it is the host rules' input, not a step's.
HOST_MARKER = "host_poll"
#: Event samples: each is its own frame (two XIDs in one poll are two events).
EVENT_NAMES = frozenset({"gpu_xid", "nccl_rank_behind", "nccl_pending_collective"})
#: The shortest polling period (a period of 0 must not spin the thread).
MIN_PERIOD_S = 0.05
#: Most samples waiting for the controller; beyond it the oldest are dropped (counted).
MAX_QUEUED = 100_000


@dataclass(frozen=True, slots=True)
class HostSourcesConfig:
    """What the host's source loop reads.

    Attributes:
        every_s: the polling period.
        nvml: each node's NVML module; None: no NVML.
        dcgm_url: a dcgm-exporter ``/metrics`` URL on this host.
        kernel_log: a kernel-log file to tail for XID lines (what it held before the run
            is skipped).
        nccl_dump_dir: the folder the ranks' NCCL flight-recorder dumps land in.
        host_counters: CPU, memory, disk and NIC counters (psutil).
        visible_devices: the job's ``CUDA_VISIBLE_DEVICES`` (None: unset).
        hostname: this host's name (default: the machine's).
    """

    every_s: float = 2.0
    nvml: NvmlFactory | None = None
    dcgm_url: str | None = None
    kernel_log: str | None = None
    nccl_dump_dir: str | None = None
    host_counters: bool = True
    visible_devices: str | None = None
    hostname: str | None = None

    @property
    def any(self) -> bool:
        return any(
            (self.nvml, self.dcgm_url, self.kernel_log, self.nccl_dump_dir, self.host_counters)
        )


class GpuRanks:
    """Which rank of a group of ranks (those reading one GPU source) uses which GPU.

    >>> ranks = JobLayout(1, 2).ranks()
    >>> m = GpuRanks(ranks, visible="GPU-b,GPU-a")
    >>> m.rank_of(gpu="0", uuid="GPU-a").rank, m.rank_of(gpu="1", uuid="GPU-b").rank
    (1, 0)
    >>> GpuRanks(ranks).rank_of(gpu="1", uuid=None).rank
    1
    >>> GpuRanks(ranks).rank_of(gpu="5", uuid=None) is None
    True
    """

    def __init__(self, ranks: Sequence[RankSpec], visible: str | None = None) -> None:
        self._by_local: dict[int, RankSpec] = {}
        for spec in sorted(ranks, key=lambda s: s.rank):
            self._by_local.setdefault(spec.local_rank, spec)
        self._visible = (
            None if visible is None else [item.strip() for item in visible.split(",") if item]
        )

    def position(self, gpu: str | None, uuid: str | None) -> int | None:
        """The GPU's place among the devices the ranks see (their local rank)."""
        if self._visible is None:
            return int(gpu) if gpu is not None and gpu.isdigit() else None
        for place, item in enumerate(self._visible):
            if item == gpu or (uuid and item and (uuid == item or uuid.startswith(item))):
                return place
        return None

    def rank_of(self, gpu: str | None, uuid: str | None) -> RankSpec | None:
        place = self.position(gpu, uuid)
        return None if place is None else self._by_local.get(place)


class HostPlaces:
    """Where a host-level report (an alert naming dcgm-exporter's ``Hostname`` and a
    ``gpu``) belongs in the job: the rank using that GPU, else the host's first node.

    >>> places = HostPlaces("gpu-07", JobLayout(1, 2).ranks())
    >>> places.locate(Subject(node="gpu-07"), "1")
    Subject(replica=0, rank=1, node='node0')
    >>> places.locate(Subject(node="gpu-07"), None)
    Subject(replica=None, rank=None, node='node0')
    >>> places.locate(Subject(node="elsewhere"), "1")
    Subject(replica=None, rank=None, node='elsewhere')
    """

    def __init__(
        self, hostname: str, ranks: Sequence[RankSpec], visible: str | None = None
    ) -> None:
        self.hostname = hostname
        self.ranks = list(ranks)
        self.map = GpuRanks(self.ranks, visible)

    def locate(self, subject: Subject, gpu: str | None) -> Subject:
        """``subject`` with its node, when it names this host, made the job's own."""
        if subject.rank is not None or subject.node != self.hostname or not self.ranks:
            return subject
        spec = self.map.rank_of(gpu, None)
        if spec is None:
            return Subject(replica=subject.replica, node=self.ranks[0].node)
        return Subject(replica=spec.replica, rank=spec.rank, node=spec.node)


def rank_labels(spec: RankSpec) -> dict[str, str]:
    """The labels that name a rank, as its own telemetry names it."""
    return {
        "rank": str(spec.rank),
        "replica": str(spec.replica),
        "node": spec.node,
        "local_rank": str(spec.local_rank),
    }


class _GpuGroup:
    """One GPU source (an NVML module) and the nodes whose ranks use its GPUs."""

    def __init__(self, source: Any, ranks: Sequence[RankSpec], visible: str | None) -> None:
        self.source = source
        self.node = ranks[0].node
        self.map = GpuRanks(ranks, visible)


class HostSources:
    """Polls this host's sources for the ranks of ``layout`` on ``nodes``.

    Args:
        config: what to read.
        layout: the job's layout.
        nodes: the job's nodes on this host (default: all of them: one machine).
        clock: seconds since the epoch.
    """

    def __init__(
        self,
        config: HostSourcesConfig,
        layout: JobLayout,
        nodes: Iterable[str] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.hostname = config.hostname or socket.gethostname()
        self.layout = layout
        node_set = set(nodes) if nodes is not None else {s.node for s in layout.ranks()}
        self.ranks = [s for s in layout.ranks() if s.node in node_set]
        self.nodes = sorted(node_set, key=lambda n: (len(n), n))
        self._by_rank = {s.rank: s for s in self.ranks}
        self.clock = clock
        self.polls = 0
        self.dropped = 0
        self._queue: list[Sample] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml = self._nvml_groups()
        self.places = HostPlaces(self.hostname, self.ranks, config.visible_devices)
        self._host_map = self.places.map
        self._dcgm = None if config.dcgm_url is None else ExporterSource.from_url(config.dcgm_url)
        self._host = self._host_source()
        self._nccl = self._nccl_source()
        self._kmsg: Any = None
        self._gpu_seen: dict[int, str] = {}

    # ---- the sources --------------------------------------------------------------------
    def _nvml_groups(self) -> list[_GpuGroup]:
        """One poller per distinct NVML module; nodes sharing one share its GPUs."""
        factory = self.config.nvml
        if factory is None or not self.ranks:
            return []
        from collector.nvml import NvmlPoller

        modules: dict[int, tuple[Any, list[RankSpec]]] = {}
        for node in self.nodes:
            module = factory(node)
            _, ranks = modules.setdefault(id(module), (module, []))
            ranks.extend(s for s in self.ranks if s.node == node)
        groups = []
        for module, ranks in modules.values():
            poller = NvmlPoller(node=ranks[0].node, nvml=module, clock=self.clock)
            groups.append(_GpuGroup(poller, ranks, self.config.visible_devices))
        return groups

    def _host_source(self) -> Any:
        if not self.config.host_counters:
            return None
        from collector.host import HostSource

        return HostSource(node=self.nodes[0] if self.nodes else self.hostname, clock=self.clock)

    def _nccl_source(self) -> Any:
        if self.config.nccl_dump_dir is None:
            return None
        from collector.nccl_hang import DumpFolderSource

        return DumpFolderSource(self.config.nccl_dump_dir, clock=self.clock)

    def _kernel_log(self) -> Any:
        """The kernel-log tail, made at start: what the log held before is skipped."""
        if self.config.kernel_log is None:
            return None
        from collector.kmsg import KernelLogSource

        pci: dict[str, str] = {}
        for group in self._nvml:
            try:
                pci.update(group.source.pci_to_gpu())
            except Exception:
                log.warning("cannot read the GPUs' PCI ids through NVML", exc_info=True)
        source = KernelLogSource(
            self.config.kernel_log, node=self.nodes[0] if self.nodes else None, pci_to_gpu=pci
        )
        source.collect()  # the log's past is not this run's
        return source

    # ---- polling ------------------------------------------------------------------------
    def poll(self) -> list[Sample]:
        """One reading of every source, labelled, queued for ``take`` and returned. A source
        that raises loses its reading (logged), never the others'."""
        if self._kmsg is None and self.config.kernel_log is not None:
            self._kmsg = self._safely("kernel_log", self._kernel_log)
        samples: list[Sample] = []
        for group in self._nvml:
            read = self._safely("nvml", group.source.collect) or []
            samples += [self._gpu(s, group.map, "nvml", group.node) for s in read]
        if self._dcgm is not None:
            read = self._safely("dcgm", self._dcgm.collect) or []
            samples += [self._dcgm_sample(s) for s in read]
        if self._kmsg is not None:
            read = self._safely("kernel_log", self._kmsg.collect) or []
            samples += [self._gpu(s, self._host_map, "kernel_log", None) for s in read]
        if self._nccl is not None:
            read = self._safely("nccl", self._nccl.collect) or []
            samples += [self._ranked(s, "nccl") for s in read]
        if self._host is not None:
            read = self._safely("host", self._host.collect) or []
            samples += [self._label(s, {LABEL_SOURCE: "host"}) for s in read]
        self.polls += 1
        if samples:
            with self._lock:
                self._queue.extend(samples)
                excess = len(self._queue) - MAX_QUEUED
                if excess > 0:
                    del self._queue[:excess]
                    self.dropped += excess
        return samples

    def take(self) -> list[Sample]:
        """The samples polled since the last call, oldest first."""
        with self._lock:
            taken, self._queue = self._queue, []
        return taken

    def _safely(self, name: str, read: Callable[[], Any]) -> Any:
        try:
            return read()
        except Exception:
            log.warning("host source %s failed; its reading is lost", name, exc_info=True)
            return None

    # ---- labels -------------------------------------------------------------------------
    def _label(self, sample: Sample, extra: Mapping[str, str]) -> Sample:
        labels = {**sample.labels, **extra, LABEL_HOST: self.hostname}
        return Sample(sample.name, sample.value, sample.time, labels, sample.step)

    def _gpu(self, sample: Sample, gpus: GpuRanks, source: str, node: str | None) -> Sample:
        """A GPU's sample with the rank that uses it (its node's when none does)."""
        labels = {LABEL_SOURCE: source}
        spec = gpus.rank_of(sample.labels.get("gpu"), sample.labels.get("uuid"))
        if spec is not None:
            labels.update(rank_labels(spec))
            if "gpu" in sample.labels:
                self._gpu_seen[spec.rank] = sample.labels["gpu"]
        elif node is not None or self.nodes:
            labels["node"] = node or self.nodes[0]
        return self._label(sample, labels)

    def _dcgm_sample(self, sample: Sample) -> Sample:
        """dcgm-exporter's ``Hostname`` (read as ``node``) is the host; the node is ours."""
        labels = dict(sample.labels)
        exporter_host = labels.pop("node", None)
        sample = Sample(sample.name, sample.value, sample.time, labels, sample.step)
        out = self._gpu(sample, self._host_map, "dcgm", None)
        if exporter_host and exporter_host != self.hostname:
            labels = {**out.labels, "exporter_host": exporter_host}
            out = Sample(out.name, out.value, out.time, labels)
        return out

    def _ranked(self, sample: Sample, source: str) -> Sample:
        """A sample naming a global rank gets that rank's replica and node."""
        labels = {LABEL_SOURCE: source}
        rank = sample.labels.get("rank", "")
        spec = self._by_rank.get(int(rank)) if rank.isdigit() else None
        if spec is not None:
            labels.update(rank_labels(spec))
        return self._label(sample, labels)

    def gpu_of(self, rank: int) -> str:
        """The GPU index a rank uses, as its GPU source names it ("" when unknown)."""
        return self._gpu_seen.get(rank, "")

    # ---- the thread ---------------------------------------------------------------------
    def __enter__(self) -> HostSources:
        self.poll()  # the GPUs are known before any rank starts
        self._thread = threading.Thread(target=self._loop, name="eagleeye-host", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        for group in self._nvml:
            self._safely("nvml", group.source.close)

    def _loop(self) -> None:
        while not self._stop.wait(max(self.config.every_s, MIN_PERIOD_S)):
            self.poll()


def host_frames(samples: Iterable[Sample]) -> list[Frame]:
    """The host rules' frames: one per subject and GPU of a poll, in canonical names, and
    one per event (an XID, an NCCL dump's verdict); each carries ``host_poll``."""
    values: dict[tuple[Subject, str, str], dict[str, float]] = defaultdict(dict)
    times: dict[tuple[Subject, str, str], float] = {}
    frames: list[Frame] = []
    for sample in samples:
        subject = subject_of(sample.labels)
        if sample.name in EVENT_NAMES:
            canon = canonical_values({sample.name: sample.value})
            frames.append(Frame(subject, None, sample.time, {**canon, HOST_MARKER: 1.0}))
            continue
        # one frame per source: two sources of one GPU (NVML's flag, dcgm's reasons) are
        # two readings, not one
        key = (subject, sample.labels.get("gpu", ""), sample.labels.get(LABEL_SOURCE, ""))
        values[key][sample.name] = sample.value
        times[key] = max(times.get(key, sample.time), sample.time)
    for key, vals in values.items():
        frames.append(Frame(key[0], None, times[key], {**canonical_values(vals), HOST_MARKER: 1.0}))
    return frames


__all__ = [
    "EVENT_NAMES",
    "HOST_MARKER",
    "LABEL_HOST",
    "LABEL_SOURCE",
    "GpuRanks",
    "HostPlaces",
    "HostSources",
    "HostSourcesConfig",
    "NvmlFactory",
    "host_frames",
    "rank_labels",
]
