from __future__ import annotations

import math

import pytest

from collector.types import Frame, Subject
from detectors import DETECTORS, UnknownDetectorError, create, register
from detectors.errors import DetectorError
from detectors.rules import NonFiniteLoss, ProcessExit
from detectors.types import Severity

RANK3 = Subject(replica=1, rank=3, node="node1")


def test_a_killed_rank_is_a_critical_process_exit_with_its_signal() -> None:
    (finding,) = ProcessExit().process(Frame(RANK3, 40, 5.0, {"exit_code": -9, "attempt": 0}))
    assert finding.kind == "process_exit"
    assert finding.severity is Severity.CRITICAL
    assert finding.subject == RANK3
    assert finding.step == 40
    assert finding.evidence == {"exit_code": -9, "signal": 9, "attempt": 0}


@pytest.mark.parametrize(
    "values", [{"exit_code": 0}, {"exit_code": 1, "collateral": 1}, {"loss": 1.0}]
)
def test_clean_exits_collateral_exits_and_other_frames_are_not_findings(values) -> None:
    assert ProcessExit().process(Frame(RANK3, 1, 0.0, values)) == ()


def test_non_finite_loss_names_the_bad_features() -> None:
    detector = NonFiniteLoss()
    assert not detector.process(Frame(RANK3, 1, 0.0, {"loss": 2.0, "grad_norm": 1.0}))
    (finding,) = detector.process(Frame(RANK3, 2, 0.0, {"loss": math.nan, "grad_norm": 1.0}))
    assert finding.kind == "nan"
    assert math.isnan(finding.evidence["loss"])
    assert "grad_norm" not in finding.evidence  # finite: not evidence
    assert finding.evidence["ranks_affected"] == 1.0


def test_registry_builds_by_name_and_rejects_unknown_and_duplicate_names() -> None:
    assert create("progress_stall", {"k": 3.0}).limits.k == 3.0  # type: ignore[attr-defined]
    with pytest.raises(UnknownDetectorError, match="known: .*process_exit"):
        create("no_such_detector")
    with pytest.raises(DetectorError, match="already registered"):
        register("process_exit", ProcessExit)
    with pytest.raises(DetectorError, match="bad parameters"):
        create("progress_stall", {"nonsense": 1})
    assert {"process_exit", "non_finite_loss", "progress_stall"} <= set(DETECTORS)
