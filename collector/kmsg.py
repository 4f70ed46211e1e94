"""Kernel-log XID lines (``NVRM: Xid (PCI:0000:3b:00): 79, ...``) into XID events.

The NVIDIA driver logs every XID to the kernel ring buffer. The same line reaches us in
several spellings, all accepted: ``dmesg`` (``[ 1234.5] NVRM: ...``, seconds since boot),
``dmesg -T`` (``[Tue Mar 12 10:01:02 2024] NVRM: ...``), journald or syslog
(``Mar 12 10:01:02 host kernel: NVRM: ...``) and raw ``/dev/kmsg`` records
(``3,812,1234567890,-;NVRM: ...``, microseconds since boot).

>>> p = parse_kmsg("[ 12.5] NVRM: Xid (PCI:0000:3b:00): 79, pid=7, GPU has fallen off the bus.",
...                time=100.0)
>>> e = p.events[0]
>>> e.value, e.labels["pci"], e.labels["severity"]
(79.0, '0000:3b:00', 'fatal')
"""

from __future__ import annotations

import os
import re
import time as _time
from collections import Counter
from collections.abc import Callable, Mapping
from datetime import datetime

from collector._tail import FileTail
from collector.events import Event, Parsed, clean_label
from collector.types import Sample
from collector.xid import lookup, xid_labels

_XID = re.compile(
    r"NVRM: Xid \(PCI:(?P<pci>[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)\):"
    r"\s*(?P<code>\d{1,5}),\s*(?P<rest>.*)$"
)
_UPTIME = re.compile(r"^\[\s*(?P<s>\d+\.\d+)\]")
_WALL = re.compile(r"^\[(?P<d>[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4})\]")
_KMSG = re.compile(r"^\d+,\d+,(?P<us>\d+),[^;]*;")
_PID = re.compile(r"pid=(?P<pid>'?[^,']*'?)")
_NAME = re.compile(r"name=(?P<name>[^,]*)")

#: Longest line considered: the driver's lines are short; a megabyte "line" is garbage.
MAX_LINE = 4096


def parse_kmsg(
    text: str,
    *,
    time: float,
    boot_time: float | None = None,
    node: str | None = None,
    pci_to_gpu: Mapping[str, str] | None = None,
) -> Parsed:
    """Reads XID events out of kernel-log text; other lines are ignored.

    Args:
        text: kernel log text, any of the spellings in the module docstring.
        time: the time given to events whose line has no usable time stamp.
        boot_time: seconds since the epoch at boot; turns dmesg's uptime stamps into
            times. Without it such lines get ``time``.
        node: the node label of every event.
        pci_to_gpu: PCI bus id (``0000:3b:00``, lower case) -> GPU index, e.g. from NVML.

    Returns:
        ``gpu_xid`` events (value = XID code; labels pci, gpu when known, node, xid,
        xid_name, severity, pid, process) and drops: ``malformed_xid`` for a line naming an
        XID that cannot be read, ``line_too_long`` for absurd lines.
    """
    events: list[Event] = []
    dropped: Counter[str] = Counter()
    for line in text.splitlines():
        if "NVRM: Xid" not in line:
            continue
        if len(line) > MAX_LINE:
            dropped["line_too_long"] += 1
            continue
        event = _parse_line(line, time, boot_time, node, pci_to_gpu or {})
        if event is None:
            dropped["malformed_xid"] += 1
        else:
            events.append(event)
    return Parsed(events=tuple(events), dropped=dict(dropped))


def _parse_line(
    line: str,
    default_time: float,
    boot_time: float | None,
    node: str | None,
    pci_to_gpu: Mapping[str, str],
) -> Event | None:
    match = _XID.search(line)
    if match is None:
        return None
    code = int(match["code"])
    pci = match["pci"].lower()
    rest = match["rest"].strip()
    labels = {"pci": pci, **xid_labels(code), "via": "kernel_log"}
    if pci in pci_to_gpu:
        labels["gpu"] = pci_to_gpu[pci]
    if node:
        labels["node"] = node
    pid = _PID.search(rest)
    if pid:
        labels["pid"] = clean_label(pid["pid"].strip("'"))
    name = _NAME.search(rest)
    if name:
        labels["process"] = clean_label(name["name"].strip())
    when = _line_time(line, boot_time)
    message = _message(rest) or lookup(code).name
    return Event("gpu_xid", default_time if when is None else when, float(code), labels, message)


def _line_time(line: str, boot_time: float | None) -> float | None:
    """The time stamp a line carries, as seconds since the epoch, when it can be known."""
    wall = _WALL.match(line)
    if wall:
        try:
            return datetime.strptime(
                wall["d"].replace("  ", " "), "%a %b %d %H:%M:%S %Y"
            ).timestamp()
        except ValueError:
            return None
    if boot_time is None:
        return None
    up = _UPTIME.match(line)
    if up:
        return boot_time + float(up["s"])
    raw = _KMSG.match(line)
    if raw:
        return boot_time + int(raw["us"]) / 1e6
    return None


def _message(rest: str) -> str:
    """The driver's own words, after the ``pid=..., name=...,`` prefix."""
    parts = [p.strip() for p in rest.split(",")]
    kept = [p for p in parts if not p.startswith(("pid=", "name="))]
    return clean_label(", ".join(kept))


def boot_time_now() -> float:
    """Seconds since the epoch at which this machine booted (Linux ``/proc/uptime``)."""
    with open("/proc/uptime", encoding="ascii") as f:
        return _time.time() - float(f.read().split()[0])


class KernelLogSource:
    """Tails a kernel-log file (``dmesg`` output, ``kern.log``) and yields new XID events.

    Each ``collect()`` reads what was appended since the last one; a file that shrank
    (rotated) is read again from the start. It never blocks and never raises on content.

    Args:
        path: the file to tail.
        node: the node label of every event.
        clock: seconds since the epoch, injected for tests.
        boot_time: see :func:`parse_kmsg`.
        pci_to_gpu: see :func:`parse_kmsg`.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        node: str | None = None,
        clock: Callable[[], float] = _time.time,
        boot_time: float | None = None,
        pci_to_gpu: Mapping[str, str] | None = None,
    ) -> None:
        self.path = os.fspath(path)
        self.node = node
        self._clock = clock
        self._boot_time = boot_time
        self._pci_to_gpu = dict(pci_to_gpu or {})
        self._tail = FileTail(self.path)
        self.dropped: Counter[str] = Counter()

    def collect(self) -> list[Sample]:
        complete = self._tail.read_lines()
        self.dropped.update(self._tail.dropped)
        self._tail.dropped.clear()
        parsed = parse_kmsg(
            complete,
            time=self._clock(),
            boot_time=self._boot_time,
            node=self.node,
            pci_to_gpu=self._pci_to_gpu,
        )
        self.dropped.update(parsed.dropped)
        return parsed.all_samples()
