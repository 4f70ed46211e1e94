"""GPU metrics of a run: one NVML poller per node of the job, read on a background thread.

``eagleeye run --gpu-metrics nvml`` polls the GPUs through pynvml; tests hand in
collector.testing.FakeNVML (one per node) and inject XIDs into it. What the pollers read
goes to a sink (the exporter), in the canonical vocabulary with ``node``, ``gpu`` and
``uuid`` labels. A poller that fails is counted in its ``dropped``, never raised.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from collector.nvml import NvmlPoller
from collector.types import Sample

#: node name -> the NVML module (pynvml or a fake) its poller reads.
NvmlFactory = Callable[[str], Any]


class GpuPolling:
    """Polls every node's GPUs every ``every_s`` seconds until stopped.

    Args:
        nodes: the job's node names (``node0``, ...).
        nvml_for: the NVML module of a node.
        sink: receives each poll's samples.
        every_s: the polling period.
    """

    def __init__(
        self,
        nodes: Sequence[str],
        nvml_for: NvmlFactory,
        sink: Callable[[list[Sample]], None],
        every_s: float = 1.0,
    ) -> None:
        self.pollers = [NvmlPoller(node=node, nvml=nvml_for(node)) for node in nodes]
        self.sink = sink
        self.every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="eagleeye-gpus", daemon=True)

    def poll(self) -> list[Sample]:
        """One reading of every node's GPUs, handed to the sink and returned."""
        samples = [s for poller in self.pollers for s in poller.collect()]
        if samples:
            self.sink(samples)
        return samples

    def __enter__(self) -> GpuPolling:
        self.poll()  # the GPUs are known (and their XID gauges at 0) before any rank starts
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for poller in self.pollers:
            poller.close()

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.poll()


def pynvml_factory() -> NvmlFactory:
    """pynvml for every node (one machine: the nodes of a local job share its GPUs).

    Raises:
        EagleEyeError: pynvml is not installed or finds no driver.
    """
    from collector import nvml
    from eagleeye.errors import EagleEyeError

    if not nvml.is_available():
        raise EagleEyeError(
            "--gpu-metrics nvml needs pynvml and an NVIDIA driver: pip install "
            "'eagleeye[gpu]' on a GPU machine, or leave --gpu-metrics off"
        )
    import pynvml  # type: ignore[import-untyped, import-not-found, unused-ignore]

    return lambda node: pynvml


def nvml_source(source: str, dcgm_url: str | None = None) -> NvmlFactory | None:
    """``--gpu-metrics``: off, NVML (pynvml) on every node, or auto: NVML when pynvml finds
    a GPU and no dcgm-exporter is read instead."""
    if source == "off":
        return None
    if source == "auto":
        from collector import nvml

        if dcgm_url is not None or not nvml.is_available():
            return None
    return pynvml_factory()


#: What makes every rank's NCCL flight recorder dump on a collective timeout.
NCCL_DUMP_ENV = {
    "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
}

__all__ = ["NCCL_DUMP_ENV", "GpuPolling", "NvmlFactory", "nvml_source", "pynvml_factory"]
