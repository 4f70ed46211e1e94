from __future__ import annotations

import pytest

from collector.frames import frames_from_samples
from collector.types import Sample, Subject

LABELS = {"rank": "3", "replica": "1", "node": "node1"}


def test_one_frame_per_rank_and_step_with_collectives_summed() -> None:
    samples = [
        Sample("step_time", 0.2, 10.0, LABELS, step=4),
        Sample("loss", 2.0, 10.0, LABELS, step=4),
        Sample("collective", 0.03, 9.9, {**LABELS, "op": "all_reduce"}, step=4),
        Sample("collective", 0.02, 9.95, {**LABELS, "op": "all_reduce"}, step=4),
        Sample("step_time", 0.3, 10.1, {**LABELS, "rank": "2"}, step=4),
        Sample("event.checkpoint", 4.0, 10.2, LABELS, step=4),
        Sample("cpu", 50.0, 10.2, LABELS),
    ]
    frames = {f.subject: f for f in frames_from_samples(samples)}
    assert set(frames) == {
        Subject(replica=1, rank=3, node="node1"),
        Subject(replica=1, rank=2, node="node1"),
    }
    mine = frames[Subject(replica=1, rank=3, node="node1")]
    assert mine.step == 4
    assert mine.time == 10.0
    assert mine.values["collective_time"] == pytest.approx(0.05)
    assert set(mine.values) == {"step_time", "loss", "collective_time"}
