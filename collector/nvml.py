"""The per-node GPU poller, through NVML (the ``nvidia-ml-py`` package, module ``pynvml``).

One poller per node reads every GPU: utilisation, memory, temperature, power, SM and memory
clocks, throttle reasons, ECC counters, remapped rows, PCIe replays, NVLink errors, and XID
events through NVML's event API. The import is guarded: without the ``gpu`` extra or
without a driver, :func:`is_available` is False and nothing else changes. Tests drive the
poller with :class:`collector.testing.FakeNVML`, which has pynvml's function names.

A metric a GPU does not support is asked for once, then skipped; any NVML error is counted
in :attr:`NvmlPoller.dropped`, never raised out of :meth:`NvmlPoller.collect`.
"""

from __future__ import annotations

import time as _time
from collections import Counter
from collections.abc import Callable
from typing import Any

from collector.errors import CollectorError
from collector.events import Event
from collector.types import Sample
from collector.vocabulary import canonical
from collector.xid import lookup, xid_labels

try:  # the gpu extra; absent on CPU-only machines
    import pynvml as _pynvml  # type: ignore[import-untyped, import-not-found, unused-ignore]
except ImportError:  # pragma: no cover - depends on the installation
    _pynvml = None

#: Throttle-reason bits (nvml.h ``nvmlClocksEventReason*``) that mean heat or power.
THERMAL_BITS = 0x20 | 0x40  # software and hardware thermal slowdown
POWER_BITS = 0x04 | 0x80  # software power cap, hardware power brake
_NVLINK_COUNTERS = (("replay", 0), ("recovery", 1), ("crc_flit", 2), ("crc_data", 3))
#: Most XID events taken from NVML's queue in one collect: a storm must not stall the poller.
MAX_EVENTS_PER_COLLECT = 256


def is_available() -> bool:
    """True when pynvml imports and NVML initialises (a driver and a GPU are present)."""
    if _pynvml is None:
        return False
    try:
        _pynvml.nvmlInit()
        _pynvml.nvmlShutdown()
    except Exception:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return False
    return True


def pci_short(bus_id: str | bytes) -> str:
    """NVML's ``00000000:3B:00.0`` as the kernel log spells it: ``0000:3b:00``."""
    text = bus_id.decode() if isinstance(bus_id, bytes) else str(bus_id)
    parts = text.lower().split(":")
    if len(parts) < 3:
        return text.lower()
    return f"{parts[-3][-4:]}:{parts[-2]}:{parts[-1].split('.')[0]}"


class NvmlPoller:
    """Reads every GPU of this node through NVML on each ``collect()``.

    Args:
        node: the node label of every sample.
        nvml: the NVML module (pynvml) or a fake with the same names; pynvml by default.
        clock: seconds since the epoch, injected for tests.

    Raises:
        CollectorError: at construction, when no NVML module is given and pynvml is absent.

    Example:
        >>> from collector.testing import FakeNVML
        >>> poller = NvmlPoller(node="n1", nvml=FakeNVML(gpus=1), clock=lambda: 0.0)
        >>> [s.value for s in poller.collect() if s.name == "gpu_temp"]
        [45.0]
    """

    def __init__(
        self, *, node: str, nvml: Any = None, clock: Callable[[], float] = _time.time
    ) -> None:
        if nvml is None and _pynvml is None:
            raise CollectorError(
                "pynvml is not installed; install the gpu extra: pip install 'eagleeye[gpu]'"
            )
        self.node = node
        self._nvml = nvml if nvml is not None else _pynvml
        self._clock = clock
        self._handles: list[Any] = []
        self._labels: list[dict[str, str]] = []
        self._event_set: Any = None
        self._unsupported: set[tuple[int, str]] = set()
        self.dropped: Counter[str] = Counter()
        self.events: list[Event] = []

    def start(self) -> None:
        """Initialises NVML, finds the GPUs and registers for XID events (idempotent)."""
        if self._handles:
            return
        nv = self._nvml
        nv.nvmlInit()
        for index in range(nv.nvmlDeviceGetCount()):
            handle = nv.nvmlDeviceGetHandleByIndex(index)
            self._handles.append(handle)
            self._labels.append(self._identity(index, handle))
        try:
            self._event_set = nv.nvmlEventSetCreate()
        except nv.NVMLError:
            self.dropped["xid_events_unavailable"] += 1
            return
        # One GPU that cannot register (lost, not supported) must not cost the others.
        xid = nv.nvmlEventTypeXidCriticalError
        for index, handle in enumerate(self._handles):
            self._call(
                index, "register_events", nv.nvmlDeviceRegisterEvents, handle, xid, self._event_set
            )

    def close(self) -> None:
        """Frees the event set and shuts NVML down."""
        if not self._handles:
            return
        if self._event_set is not None:
            self._call(-1, "event_set_free", self._nvml.nvmlEventSetFree, self._event_set)
        self._nvml.nvmlShutdown()
        self._handles, self._labels, self._event_set = [], [], None

    def pci_to_gpu(self) -> dict[str, str]:
        """Kernel-log PCI id -> GPU index, for :func:`collector.kmsg.parse_kmsg`."""
        self.start()
        return {labels["pci"]: labels["gpu"] for labels in self._labels if "pci" in labels}

    def collect(self) -> list[Sample]:
        """One reading of every GPU in canonical names (collector.vocabulary), plus
        ``gpu_xid`` samples for XIDs since the last one."""
        try:
            self.start()
        except Exception as exc:  # NVML gone (driver unloaded): count it, never raise
            self.dropped[f"nvml_init:{type(exc).__name__}"] += 1
            return []
        now = self._clock()
        samples: list[Sample] = []
        for index, handle in enumerate(self._handles):
            for raw_name, raw_value in self._read_gpu(index, handle):
                # NVML's own names stay inside (dropped counters, the fake's keys); what
                # leaves is the canonical vocabulary, in its units (bytes -> GB).
                name, value = canonical(raw_name, float(raw_value))
                samples.append(Sample(name, value, now, self._labels[index]))
        events = self._drain_xids(now)
        self.events.extend(events)
        del self.events[:-1000]  # keep the latest only
        return samples + [e.to_sample() for e in events]

    def _identity(self, index: int, handle: Any) -> dict[str, str]:
        labels = {"node": self.node, "gpu": str(index)}
        uuid = self._call(index, "uuid", self._nvml.nvmlDeviceGetUUID, handle)
        if uuid is not None:
            labels["uuid"] = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
        pci = self._call(index, "pci", self._nvml.nvmlDeviceGetPciInfo, handle)
        if pci is not None:
            labels["pci"] = pci_short(pci.busId)
        return labels

    def _read_gpu(self, i: int, h: Any) -> list[tuple[str, float]]:
        nv = self._nvml
        out: list[tuple[str, float]] = []
        util = self._call(i, "utilization", nv.nvmlDeviceGetUtilizationRates, h)
        if util is not None:
            out += [("gpu_util_pct", util.gpu), ("gpu_mem_util_pct", util.memory)]
        mem = self._call(i, "memory", nv.nvmlDeviceGetMemoryInfo, h)
        if mem is not None:
            out += [("gpu_mem_used_bytes", mem.used), ("gpu_mem_total_bytes", mem.total)]
        self._add(out, i, "gpu_temp_c", nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)
        power = self._call(i, "power", nv.nvmlDeviceGetPowerUsage, h)
        if power is not None:
            out.append(("gpu_power_w", power / 1000.0))  # NVML reports milliwatts
        self._add(out, i, "gpu_sm_clock_mhz", nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM)
        self._add(out, i, "gpu_mem_clock_mhz", nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM)
        out += self._throttle(i, h)
        out += self._memory_errors(i, h)
        self._add(out, i, "gpu_pcie_replays_total", nv.nvmlDeviceGetPcieReplayCounter, h)
        out += self._nvlink(i, h)
        return out

    def _throttle(self, i: int, h: Any) -> list[tuple[str, float]]:
        nv = self._nvml
        # Renamed "clocks event reasons" in newer drivers; the old name stays as an alias.
        read = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
        if read is None:
            read = nv.nvmlDeviceGetCurrentClocksThrottleReasons
        mask = self._call(i, "throttle", read, h)
        if mask is None:
            return []
        mask = int(mask)
        return [
            ("gpu_throttle_reasons", mask),
            ("gpu_throttle_thermal", 1.0 if mask & THERMAL_BITS else 0.0),
            ("gpu_throttle_power", 1.0 if mask & POWER_BITS else 0.0),
        ]

    def _memory_errors(self, i: int, h: Any) -> list[tuple[str, float]]:
        nv = self._nvml
        out: list[tuple[str, float]] = []
        for name, kind in (
            ("gpu_ecc_corrected_total", nv.NVML_MEMORY_ERROR_TYPE_CORRECTED),
            ("gpu_ecc_uncorrected_total", nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
        ):
            self._add(out, i, name, nv.nvmlDeviceGetTotalEccErrors, h, kind, nv.NVML_VOLATILE_ECC)
        rows = self._call(i, "remapped_rows", nv.nvmlDeviceGetRemappedRows, h)
        if rows is not None:
            correctable, uncorrectable, pending, failure = rows
            out += [
                ("gpu_remapped_rows_correctable", correctable),
                ("gpu_remapped_rows_uncorrectable", uncorrectable),
                ("gpu_remap_pending", float(bool(pending))),
                ("gpu_remap_failure", float(bool(failure))),
            ]
        return out

    def _nvlink(self, i: int, h: Any) -> list[tuple[str, float]]:
        """NVLink error counters summed over the GPU's links (per link is too many series)."""
        nv = self._nvml
        if (i, "nvlink") in self._unsupported:
            return []
        totals = dict.fromkeys((name for name, _ in _NVLINK_COUNTERS), 0.0)
        links = 0
        for link in range(nv.NVML_NVLINK_MAX_LINKS):
            try:
                for name, counter in _NVLINK_COUNTERS:
                    totals[name] += nv.nvmlDeviceGetNvLinkErrorCounter(h, link, counter)
                links += 1
            except nv.NVMLError:
                continue  # links beyond the GPU's count, or not supported
        if links == 0:
            self._unsupported.add((i, "nvlink"))
            return []
        return [(f"gpu_nvlink_{name}_errors_total", value) for name, value in totals.items()]

    def _add(self, out: list[tuple[str, float]], i: int, name: str, fn: Any, *args: Any) -> None:
        value = self._call(i, name, fn, *args)
        if value is not None:
            out.append((name, value))

    def _call(self, i: int, what: str, fn: Any, *args: Any) -> Any:
        """Calls NVML; a not-supported metric is skipped from now on, any error counted."""
        if (i, what) in self._unsupported:
            return None
        nv = self._nvml
        try:
            return fn(*args)
        except nv.NVMLError_NotSupported:
            self._unsupported.add((i, what))
            self.dropped[f"not_supported:{what}"] += 1
        except nv.NVMLError as exc:
            self.dropped[f"nvml_error:{what}:{type(exc).__name__}"] += 1
        return None

    def _drain_xids(self, now: float) -> list[Event]:
        nv = self._nvml
        if self._event_set is None:
            return []
        events = []
        for _ in range(MAX_EVENTS_PER_COLLECT):
            try:
                data = nv.nvmlEventSetWait_v2(self._event_set, 0)
            except nv.NVMLError_Timeout:
                break  # the queue is empty
            except nv.NVMLError as exc:
                self.dropped[f"nvml_error:xid_wait:{type(exc).__name__}"] += 1
                break
            if data.eventType == nv.nvmlEventTypeXidCriticalError:
                events.append(self._xid_event(data, now))
        return events

    def _xid_event(self, data: Any, now: float) -> Event:
        code = int(data.eventData)
        # ctypes handles do not compare by value: ask NVML which GPU sent the event.
        index = self._call(-1, "device_index", self._nvml.nvmlDeviceGetIndex, data.device)
        known = isinstance(index, int) and 0 <= index < len(self._labels)
        where = dict(self._labels[index]) if known else {"node": self.node}
        labels = {**where, **xid_labels(code), "via": "nvml_event"}
        return Event("gpu_xid", now, float(code), labels, lookup(code).name)
