"""The XID catalogue: what an NVIDIA driver XID code means and what usually fixes it.

Drawn from NVIDIA's XID documentation as summarised in the project's fault catalogue
(FAULTS.md). Severity is a plain string so the collector stays free of the detectors'
types: ``fatal`` (the GPU or the job cannot go on), ``warn`` (watch it; it may be the
application or a degrading part) or ``info``.

>>> lookup(79).name
'GPU has fallen off the bus'
>>> lookup(79).severity
'fatal'
>>> lookup(424242).severity
'warn'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

XidSeverity = Literal["fatal", "warn", "info"]


@dataclass(frozen=True, slots=True)
class XidInfo:
    """One XID code: its name, how bad it is and the usual action."""

    code: int
    name: str
    severity: XidSeverity
    action: str


_EVICT = "checkpoint if still possible, evict the node, restart the replica"
_RESET = "reset the GPU (drain the node first); evict if it repeats"
_APP = "usually the application (bad address, illegal instruction): restart the rank"

XID_CATALOGUE: dict[int, XidInfo] = {
    info.code: info
    for info in (
        XidInfo(13, "Graphics engine exception", "warn", _APP),
        XidInfo(31, "GPU memory page fault", "warn", _APP),
        XidInfo(32, "Invalid or corrupted push buffer stream", "warn", _RESET),
        XidInfo(38, "Driver firmware error", "fatal", _EVICT),
        XidInfo(43, "GPU stopped processing", "warn", _APP),
        XidInfo(
            45, "Preemptive cleanup, due to previous errors", "info", "none: follows another error"
        ),
        XidInfo(48, "Double-bit ECC error", "fatal", _EVICT),
        XidInfo(61, "Internal micro-controller breakpoint/warning", "warn", _RESET),
        XidInfo(62, "Internal micro-controller halt", "fatal", _EVICT),
        XidInfo(
            63,
            "ECC page retirement or row remapping recording event",
            "warn",
            "reset the GPU at the next opportunity to apply the remap",
        ),
        XidInfo(
            64,
            "ECC page retirement or row remapper recording failure",
            "fatal",
            "drain the node: the remap could not be recorded",
        ),
        XidInfo(68, "Video processor exception", "warn", _APP),
        XidInfo(69, "Graphics engine class error", "warn", _APP),
        XidInfo(74, "NVLink error", "fatal", _RESET),
        XidInfo(79, "GPU has fallen off the bus", "fatal", _EVICT),
        XidInfo(
            92,
            "High single-bit ECC error rate",
            "warn",
            "watch the ECC counters; drain if it grows",
        ),
        XidInfo(94, "Contained ECC error", "fatal", "restart the affected rank; reset the GPU"),
        XidInfo(95, "Uncontained ECC error", "fatal", _EVICT),
        XidInfo(109, "Context switch timeout", "warn", _APP),
        XidInfo(119, "GSP RPC timeout", "fatal", _EVICT),
        XidInfo(120, "GSP error", "fatal", _EVICT),
        XidInfo(123, "SPI PMU RPC write failure", "warn", _RESET),
        XidInfo(140, "Unrecovered ECC error", "fatal", _EVICT),
        XidInfo(
            154,
            "GPU recovery action changed",
            "fatal",
            "follow the recovery action (reset or reboot); evict the node meanwhile",
        ),
    )
}


def lookup(code: int) -> XidInfo:
    """The catalogue entry for an XID code; an unknown code is a warning to look at.

    Args:
        code: the XID number as the driver reports it.

    Returns:
        The catalogue's entry, or a ``warn`` entry named "unknown XID <code>".
    """
    info = XID_CATALOGUE.get(code)
    if info is not None:
        return info
    return XidInfo(code, f"unknown XID {code}", "warn", "look the code up in NVIDIA's XID list")


def xid_labels(code: int) -> dict[str, str]:
    """The labels every XID event carries, so sinks need not look the code up again."""
    info = lookup(code)
    return {"xid": str(code), "xid_name": info.name, "severity": info.severity}
