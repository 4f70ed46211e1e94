"""Fakes shipped with the collector, for tests of the layers above (and our own).

:class:`FakeNVML` has pynvml's function, constant and error names, so
:class:`collector.nvml.NvmlPoller` runs on it unchanged. Devices are plain mutable records
a test sets (temperature up, a throttle bit, an ECC count) between polls; XIDs are queued
with :meth:`FakeNVML.inject_xid` and come out of ``nvmlEventSetWait_v2``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from collector.types import Sample


class NVMLError(Exception):
    """pynvml's base error; ``value`` is the NVML return code."""

    def __init__(self, value: int = 999) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


class NVMLError_NotSupported(NVMLError):
    def __init__(self) -> None:
        super().__init__(3)


class NVMLError_Timeout(NVMLError):
    def __init__(self) -> None:
        super().__init__(10)


class NVMLError_GpuIsLost(NVMLError):
    def __init__(self) -> None:
        super().__init__(15)


@dataclass
class FakeGPU:
    """One fake GPU's readings; change them between polls."""

    uuid: str
    bus_id: str
    util: int = 97
    mem_util: int = 41
    mem_used: int = 70 * 2**30
    mem_total: int = 80 * 2**30
    temp: int = 45
    power_mw: int = 412_000
    sm_clock: int = 1980
    mem_clock: int = 2619
    throttle: int = 0
    ecc: dict[int, int] = field(default_factory=lambda: {0: 0, 1: 0})
    remapped: tuple[int, int, bool, bool] = (0, 0, False, False)
    pcie_replays: int = 0
    nvlinks: int = 18
    nvlink_errors: dict[int, int] = field(default_factory=lambda: {0: 0, 1: 0, 2: 0, 3: 0})
    unsupported: set[str] = field(default_factory=set)
    lost: bool = False


class FakeNVML:
    """A stand-in for the ``pynvml`` module.

    Args:
        gpus: how many GPUs the fake node has (an H100-like default each).

    Attributes:
        devices: the fake GPUs, by index; tests change their fields.
        calls: how many NVML functions were called, by name.
    """

    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_Timeout = NVMLError_Timeout
    NVMLError_GpuIsLost = NVMLError_GpuIsLost
    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    NVML_NVLINK_MAX_LINKS = 18
    nvmlEventTypeXidCriticalError = 8

    def __init__(self, gpus: int = 8) -> None:
        self.devices = [
            FakeGPU(f"GPU-fake-{i:04d}", f"00000000:{0x18 + 0x10 * i:02X}:00.0")
            for i in range(gpus)
        ]
        self.initialised = False
        self.calls: dict[str, int] = {}
        self._events: deque[SimpleNamespace] = deque()
        self._registered: set[int] = set()

    def inject_xid(self, index: int, code: int) -> None:
        """Queues an XID on GPU ``index``, as the driver would on a fault."""
        if index in self._registered:
            self._events.append(SimpleNamespace(device=index, eventType=8, eventData=code))

    def _gpu(self, handle: int, what: str) -> FakeGPU:
        self.calls[what] = self.calls.get(what, 0) + 1
        if not self.initialised:
            raise NVMLError(1)  # NVML_ERROR_UNINITIALIZED
        gpu = self.devices[handle]
        if gpu.lost:
            raise NVMLError_GpuIsLost()
        if what in gpu.unsupported:
            raise NVMLError_NotSupported()
        return gpu

    def nvmlInit(self) -> None:
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.initialised = False

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetIndex(self, handle: int) -> int:
        return handle

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return self._gpu(h, "uuid").uuid

    def nvmlDeviceGetPciInfo(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(busId=self._gpu(h, "pci").bus_id)

    def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:
        gpu = self._gpu(h, "utilization")
        return SimpleNamespace(gpu=gpu.util, memory=gpu.mem_util)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        gpu = self._gpu(h, "memory")
        return SimpleNamespace(
            used=gpu.mem_used, total=gpu.mem_total, free=gpu.mem_total - gpu.mem_used
        )

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        return self._gpu(h, "gpu_temp_c").temp

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return self._gpu(h, "power").power_mw

    def nvmlDeviceGetClockInfo(self, h: int, clock: int) -> int:
        gpu = self._gpu(h, "gpu_sm_clock_mhz" if clock == 1 else "gpu_mem_clock_mhz")
        return gpu.sm_clock if clock == 1 else gpu.mem_clock

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        return self._gpu(h, "throttle").throttle

    def nvmlDeviceGetTotalEccErrors(self, h: int, kind: int, counter: int) -> int:
        name = "gpu_ecc_corrected_total" if kind == 0 else "gpu_ecc_uncorrected_total"
        return self._gpu(h, name).ecc[kind]

    def nvmlDeviceGetRemappedRows(self, h: int) -> tuple[int, int, bool, bool]:
        return self._gpu(h, "remapped_rows").remapped

    def nvmlDeviceGetPcieReplayCounter(self, h: int) -> int:
        return self._gpu(h, "gpu_pcie_replays_total").pcie_replays

    def nvmlDeviceGetNvLinkErrorCounter(self, h: int, link: int, counter: int) -> int:
        gpu = self._gpu(h, "nvlink")
        if link >= gpu.nvlinks:
            raise NVMLError(2)  # NVML_ERROR_INVALID_ARGUMENT
        # the whole count sits on link 0, so sums over links are easy to check
        return gpu.nvlink_errors[counter] if link == 0 else 0

    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlDeviceRegisterEvents(self, h: int, types: int, event_set: Any) -> None:
        self._gpu(h, "register_events")
        self._registered.add(h)

    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> SimpleNamespace:
        if not self._events:
            raise NVMLError_Timeout()
        return self._events.popleft()

    def nvmlEventSetFree(self, event_set: Any) -> None:
        self._registered.clear()


class FakeSource:
    """A Source that yields canned batches of Samples, one batch per ``collect()``."""

    def __init__(self, batches: Iterable[Iterable[Sample]]) -> None:
        self._batches = deque(list(b) for b in batches)

    def collect(self) -> list[Sample]:
        return self._batches.popleft() if self._batches else []
