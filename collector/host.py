"""Host counters of one node (CPU, memory, disk, network) through psutil.

Memory leaks, swapping, a full disk and NIC errors are node faults the GPU telemetry does
not show. Counters are reported as totals (``*_total``), as Prometheus does, so a detector
takes rates itself; CPU utilisation is computed between two polls, so the first poll has
none. A psutil call that fails is counted in :attr:`HostSource.dropped`, never raised.
"""

from __future__ import annotations

import time as _time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import psutil

from collector.types import Sample

_Reading = list[tuple[str, float, dict[str, str]]]


class HostSource:
    """Polls psutil on each ``collect()``.

    Args:
        node: the node label of every sample.
        disk_path: the file system whose use is reported (the checkpoint or data disk).
        nics: interfaces to report; all but loopback by default.
        clock: seconds since the epoch, injected for tests.

    Example:
        >>> src = HostSource(node="n1")
        >>> any(s.name == "host_mem_total_bytes" for s in src.collect())
        True
    """

    def __init__(
        self,
        *,
        node: str,
        disk_path: str = "/",
        nics: Iterable[str] | None = None,
        clock: Callable[[], float] = _time.time,
    ) -> None:
        self.node = node
        self.disk_path = disk_path
        self.nics = None if nics is None else frozenset(nics)
        self._clock = clock
        self._last_cpu: Any = None
        self.dropped: Counter[str] = Counter()

    def collect(self) -> list[Sample]:
        now = self._clock()
        readings: _Reading = []
        for name, read in (
            ("cpu", self._cpu),
            ("memory", self._memory),
            ("disk", self._disk),
            ("network", self._network),
        ):
            try:
                readings += read()
            except (OSError, RuntimeError, AttributeError, psutil.Error):
                self.dropped[f"psutil_error:{name}"] += 1
        base = {"node": self.node}
        return [Sample(n, float(v), now, {**base, **labels}) for n, v, labels in readings]

    def _cpu(self) -> _Reading:
        times = psutil.cpu_times()
        out: _Reading = [("host_load1", psutil.getloadavg()[0], {})]
        out.append(("host_cpu_count", float(psutil.cpu_count() or 0), {}))
        last, self._last_cpu = self._last_cpu, times
        if last is None:
            return out
        total = sum(times) - sum(last)
        if total <= 0:
            return out
        idle = (times.idle - last.idle) + (getattr(times, "iowait", 0) - getattr(last, "iowait", 0))
        iowait = getattr(times, "iowait", 0) - getattr(last, "iowait", 0)
        out.append(("host_cpu_util_pct", 100.0 * (1 - idle / total), {}))
        out.append(("host_cpu_iowait_pct", 100.0 * iowait / total, {}))
        return out

    def _memory(self) -> _Reading:
        mem = psutil.virtual_memory()
        swap = psutil.swap_memory()
        return [
            ("host_mem_total_bytes", mem.total, {}),
            ("host_mem_available_bytes", mem.available, {}),
            ("host_mem_used_bytes", mem.total - mem.available, {}),
            ("host_swap_used_bytes", swap.used, {}),
        ]

    def _disk(self) -> _Reading:
        usage = psutil.disk_usage(self.disk_path)
        out: _Reading = [("host_disk_used_pct", usage.percent, {"path": self.disk_path})]
        io = psutil.disk_io_counters()
        if io is not None:  # None in some containers
            out += [
                ("host_disk_read_bytes_total", io.read_bytes, {}),
                ("host_disk_written_bytes_total", io.write_bytes, {}),
            ]
        return out

    def _network(self) -> _Reading:
        stats = psutil.net_if_stats()
        out: _Reading = []
        for nic, c in psutil.net_io_counters(pernic=True).items():
            if (self.nics is None and nic == "lo") or (
                self.nics is not None and nic not in self.nics
            ):
                continue
            labels = {"nic": nic}
            out += [
                ("host_net_rx_bytes_total", c.bytes_recv, labels),
                ("host_net_tx_bytes_total", c.bytes_sent, labels),
                ("host_net_rx_errors_total", c.errin, labels),
                ("host_net_tx_errors_total", c.errout, labels),
                ("host_net_rx_drops_total", c.dropin, labels),
                ("host_net_tx_drops_total", c.dropout, labels),
            ]
            if nic in stats:
                out.append(("host_net_up", 1.0 if stats[nic].isup else 0.0, labels))
        return out
