"""One contract suite over every registered detector (scikit-learn/river style)."""

from __future__ import annotations

import json
import math
import pickle
from collections.abc import Callable, Iterator

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from collector.types import JOB, Frame, Subject
from detectors.base import Detector, StreamingDetector
from detectors.changepoint import ThroughputChange
from detectors.numerics import SeriesSpike
from detectors.registry import DETECTORS, create
from detectors.types import Finding

NAMES = sorted(DETECTORS)
FEATURES = (
    "step_time",
    "compute_ms",
    "data_wait_ms",
    "comm_ms",
    "loss",
    "grad_norm",
    "gpu_temp",
    "sm_clock",
    "mem_used",
)


def _stream(n: int, seed: int = 0) -> Iterator[Frame]:
    rng = np.random.default_rng(seed)
    for step in range(n):
        for rank in range(8):
            values = {f: 100.0 * (1 + 0.01 * rng.standard_normal()) for f in FEATURES}
            yield Frame(Subject(0, rank, f"n{rank // 4}"), step, float(step), values)


ODD = [
    Frame(JOB, None, 0.0, {}),
    Frame(Subject(0, 1, "n0"), 3, 1.0, {"loss": math.nan, "step_time": math.inf}),
    Frame(Subject(node="n0"), 4, 2.0, {"compute_ms": -1.0}),
    Frame(Subject(0, 2, None), 5, 3.0, {"unknown_feature": 1.0}),
]


@pytest.mark.parametrize("name", NAMES)
def test_satisfies_the_detector_protocol(name: str) -> None:
    det = create(name)
    assert isinstance(det, Detector)
    assert isinstance(det.name, str)


@pytest.mark.parametrize("name", NAMES)
def test_odd_frames_give_findings_or_nothing_never_an_error(name: str) -> None:
    det = create(name)
    out = [f for frame in [*_stream(3), *ODD] for f in det.process(frame)]
    out += det.poll(1e9)
    for finding in out:
        assert isinstance(finding, Finding)
        # through strict JSON and back (a NaN is no equal of itself: compare the texts)
        text = json.dumps(finding.to_json(), allow_nan=False)
        assert json.dumps(Finding.from_json(json.loads(text)).to_json()) == text


@pytest.mark.parametrize("name", NAMES)
def test_fresh_instances_share_no_state_and_pickle(name: str) -> None:
    a, b = create(name), create(name)
    for frame in _stream(40):
        a.process(frame)
    clone = pickle.loads(pickle.dumps(a))
    assert type(clone) is type(a)
    probe = Frame(Subject(0, 0, "n0"), 41, 41.0, dict.fromkeys(FEATURES, 100.0))
    assert [f.kind for f in clone.process(probe)] == [f.kind for f in a.process(probe)]
    assert pickle.dumps(b) == pickle.dumps(create(name))  # a's frames left b untouched


@pytest.mark.parametrize("name", NAMES)
def test_memory_is_bounded(name: str) -> None:
    det = create(name)
    frames = list(_stream(160))  # 1280 frames: past every window a detector keeps
    for frame in frames[:640]:
        det.process(frame)
    early = len(pickle.dumps(det))
    for frame in frames[640:]:
        det.process(frame)
    assert len(pickle.dumps(det)) < 1.5 * early + 10_000


SCORERS: dict[str, Callable[[], StreamingDetector]] = {
    "series_spike": lambda: SeriesSpike("x", "spike", warmup=10),
    "throughput_change": lambda: ThroughputChange("x", warmup=10),
}


@pytest.mark.parametrize("name", sorted(SCORERS))
def test_scorer_warm_up_polarity_and_prequential_auc(name: str) -> None:
    scorer = SCORERS[name]()
    assert isinstance(scorer, StreamingDetector)
    assert scorer.score_one(Frame(JOB, 0, 0.0, {"x": 1e6, "y": 1.0})) == 0.0
    rng = np.random.default_rng(0)
    scores, labels = [], []
    for step in range(600):
        spike = step > 100 and rng.random() < 0.05
        x = 10.0 + rng.standard_normal() + (8.0 if spike else 0.0)
        frame = Frame(JOB, step, float(step), {"x": x, "y": rng.standard_normal()})
        if step > 100:
            scores.append(scorer.score_one(frame))
            labels.append(spike)
        if not spike:
            scorer.learn_one(frame)
    assert roc_auc_score(labels, scores) >= 0.5
    assert np.mean([s for s, lab in zip(scores, labels, strict=True) if lab]) > np.mean(
        [s for s, lab in zip(scores, labels, strict=True) if not lab]
    )
