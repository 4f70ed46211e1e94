"""Hard rules: facts that are faults on sight, with no baseline to learn."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from collector.types import Frame
from collector.xid import lookup
from detectors.nonfinite import NonFiniteLoss
from detectors.types import Finding, Severity

__all__ = [
    "CollectiveTimeout",
    "MemoryFatal",
    "NonFiniteLoss",
    "ProcessExit",
    "ThermalThrottle",
    "XidError",
    "certain",
]


def certain(kind: str, frame: Frame, evidence: Mapping[str, float], detector: str) -> Finding:
    """A hard rule's finding: a fact, so score 1.0 and critical, about the frame's subject."""
    return Finding(
        kind, frame.subject, 1.0, Severity.CRITICAL, frame.time, frame.step, evidence, detector
    )


class ProcessExit:
    """A rank's process ended with a non-zero exit code or a signal.

    Reads the ``exit_code`` feature that the supervisor attaches to a rank's frame when the
    process ends (negative values are signals, as in ``subprocess``). An exit flagged
    ``collateral`` (a peer failed first, and this rank died of it, typically "connection
    reset") is part of the first failure's cascade and gets no finding of its own.

    >>> from collector.types import Frame, Subject
    >>> [f.kind for f in ProcessExit().process(Frame(Subject(rank=1), 7, 0.0, {"exit_code": -9}))]
    ['process_exit']
    """

    name = "process_exit"
    FEATURES = ("exit_code",)

    def process(self, frame: Frame) -> Sequence[Finding]:
        code = frame.values.get("exit_code")
        if code is None or code == 0 or frame.values.get("collateral"):
            return ()
        evidence = {"exit_code": code}
        if "attempt" in frame.values:
            evidence["attempt"] = frame.values["attempt"]
        if code < 0:
            evidence["signal"] = -code
        return (certain("process_exit", frame, evidence, self.name),)

    def poll(self, now: float) -> Sequence[Finding]:
        return ()


#: The collector's XID catalogue (collector/xid.py), the one the alerting rules use too,
#: in the detectors' severities.
_XID_SEVERITY = {"fatal": Severity.CRITICAL, "warn": Severity.WARN, "info": Severity.INFO}


def xid_severity(code: int) -> Severity:
    """The severity of an XID code after the shared catalogue (unknown codes warn)."""
    return _XID_SEVERITY[lookup(code).severity]


class XidError:
    """A GPU reported an XID; the shared catalogue gives its severity (unknown codes warn).

    Reads the ``xid`` feature. The exporter's XID gauge is sticky and cannot show the same
    code twice in a row, so only a *change* of the value per subject is an event.

    >>> from collector.types import Frame, Subject
    >>> det = XidError()
    >>> [f.severity.value for f in det.process(Frame(Subject(rank=2), 9, 0.0, {"xid": 79}))]
    ['critical']
    >>> det.process(Frame(Subject(rank=2), 10, 1.0, {"xid": 79}))
    ()
    """

    name = "xid"
    FEATURES = ("xid",)

    def __init__(self, min_severity: str = "warn") -> None:
        self.min_severity = Severity(min_severity)
        self._last: dict[object, float] = {}

    def process(self, frame: Frame) -> Sequence[Finding]:
        code = frame.values.get("xid")
        if code is None or not math.isfinite(code) or code <= 0:
            return ()
        if self._last.get(frame.subject) == code:
            return ()
        self._last[frame.subject] = code
        severity = xid_severity(int(code))
        if _RANK[severity] < _RANK[self.min_severity]:
            return ()
        return (
            Finding(
                "xid",
                frame.subject,
                1.0,
                severity,
                frame.time,
                frame.step,
                {"xid": code},
                self.name,
            ),
        )

    def poll(self, now: float) -> Sequence[Finding]:
        return ()


_RANK = {Severity.INFO: 0, Severity.WARN: 1, Severity.CRITICAL: 2}


class MemoryFatal:
    """Uncorrectable memory errors: double-bit ECC counts rising, or a row-remap failure.

    Features: ``ecc_dbe`` (cumulative double-bit errors), ``row_remap_failure`` (1 when the
    GPU could not remap a row).
    """

    name = "memory_fatal"
    FEATURES = ("ecc_dbe", "row_remap_failure")

    def __init__(self) -> None:
        self._dbe: dict[object, float] = {}

    def process(self, frame: Frame) -> Sequence[Finding]:
        evidence: dict[str, float] = {}
        dbe = frame.values.get("ecc_dbe")
        if dbe is not None and math.isfinite(dbe):
            if dbe > self._dbe.get(frame.subject, 0.0):
                evidence["ecc_dbe"] = dbe
            self._dbe[frame.subject] = dbe
        if frame.values.get("row_remap_failure", 0.0) > 0:
            evidence["row_remap_failure"] = 1.0
        if not evidence:
            return ()
        return (certain("ecc", frame, evidence, self.name),)

    def poll(self, now: float) -> Sequence[Finding]:
        return ()


class CollectiveTimeout:
    """A collective's watchdog timed out (``collective_timeout`` > 0, e.g. NCCL's watchdog)."""

    name = "collective_timeout"
    FEATURES = ("collective_timeout",)

    def process(self, frame: Frame) -> Sequence[Finding]:
        value = frame.values.get("collective_timeout", 0.0)
        if not value > 0:
            return ()
        return (certain("collective_timeout", frame, {"collective_timeout": value}, self.name),)

    def poll(self, now: float) -> Sequence[Finding]:
        return ()


class ThermalThrottle:
    """A GPU slowed down for heat: its thermal throttle flag (``throttle_thermal``, or the
    thermal bits of ``throttle_reasons``) set in ``polls`` readings in a row. One finding
    per episode: the flag must clear before the subject fires again.

    >>> from collector.types import Frame, Subject
    >>> det = ThermalThrottle(polls=2)
    >>> hot = Frame(Subject(rank=1), None, 0.0, {"throttle_reasons": 0x40, "gpu_temp": 91.0})
    >>> det.process(hot), [f.kind for f in det.process(hot)], det.process(hot)
    ((), ['thermal'], ())
    """

    name = "thermal_throttle"
    FEATURES = ("throttle_thermal", "throttle_reasons")

    def __init__(self, polls: int = 2) -> None:
        self.polls = max(1, polls)
        self._run: dict[object, int] = {}

    def process(self, frame: Frame) -> Sequence[Finding]:
        values = frame.values
        flag = values.get("throttle_thermal")
        reasons = values.get("throttle_reasons")
        if flag is None and reasons is not None and math.isfinite(reasons):
            flag = float(int(reasons) & THERMAL_BITS != 0)
        if flag is None or not math.isfinite(flag):
            return ()
        if flag <= 0:
            self._run.pop(frame.subject, None)
            return ()
        run = self._run.get(frame.subject, 0) + 1
        self._run[frame.subject] = run
        if run != self.polls:
            return ()
        evidence = {"throttle_thermal": 1.0, "polls": float(run)}
        if "gpu_temp" in values:
            evidence["gpu_temp"] = values["gpu_temp"]
        return (
            Finding(
                "thermal",
                frame.subject,
                1.0,
                Severity.WARN,
                frame.time,
                frame.step,
                evidence,
                self.name,
            ),
        )

    def poll(self, now: float) -> Sequence[Finding]:
        return ()


#: NVML's clock-event reasons for heat: software and hardware thermal slowdown.
THERMAL_BITS = 0x20 | 0x40
