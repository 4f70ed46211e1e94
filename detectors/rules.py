"""Hard rules: facts that are faults on sight, with no baseline to learn."""

from __future__ import annotations

import math
from collections.abc import Sequence

from collector.types import Frame
from detectors.types import Finding, Severity


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

    def process(self, frame: Frame) -> Sequence[Finding]:
        code = frame.values.get("exit_code")
        if code is None or code == 0 or frame.values.get("collateral"):
            return ()
        evidence = {"exit_code": code}
        if "attempt" in frame.values:
            evidence["attempt"] = frame.values["attempt"]
        if code < 0:
            evidence["signal"] = -code
        return (
            Finding(
                "process_exit",
                frame.subject,
                1.0,
                Severity.CRITICAL,
                frame.time,
                frame.step,
                evidence,
                self.name,
            ),
        )

    def poll(self, now: float) -> Sequence[Finding]:
        return ()


class NonFiniteLoss:
    """The loss or the gradient norm became NaN or infinite."""

    name = "non_finite_loss"
    FEATURES = ("loss", "grad_norm")

    def process(self, frame: Frame) -> Sequence[Finding]:
        bad = {
            k: frame.values[k]
            for k in self.FEATURES
            if k in frame.values and not math.isfinite(frame.values[k])
        }
        if not bad:
            return ()
        return (
            Finding(
                "nan", frame.subject, 1.0, Severity.CRITICAL, frame.time, frame.step, bad, self.name
            ),
        )

    def poll(self, now: float) -> Sequence[Finding]:
        return ()
