"""Telemetry of a rank's killed incarnation that arrives after its relaunch is stored but
reaches no detector: the new process starts with its progress unknown, not a stale step."""

from __future__ import annotations

from collector.types import Sample
from detectors.progress import ProgressStall
from eagleeye.ingest import LaunchedAttempts, ingest_samples, lifecycle_frames
from eagleeye.store import RunReader, RunStore
from ft_runtime.types import LifecycleEvent, Phase


def step_sample(rank: int, attempt: int, step: int, when: float) -> Sample:
    labels = {"rank": str(rank), "replica": str(rank), "node": f"node{rank}"}
    labels["attempt"] = str(attempt)
    return Sample("step_time", 0.05, when, labels, step)


def launch(rank: int, attempt: int, when: float) -> LifecycleEvent:
    detail = {"node": f"node{rank}", "replica": rank, "attempt": attempt}
    return LifecycleEvent(f"rank:{rank}", Phase.LAUNCH, when, 0, detail)


def test_a_late_sample_of_the_killed_incarnation_is_stored_but_makes_no_frame(tmp_path) -> None:
    launched = LaunchedAttempts()
    stall = ProgressStall(k=10, min_silence_s=1.0)
    store = RunStore(tmp_path)
    try:
        for step in range(5):
            for frame in ingest_samples(store, [step_sample(0, 0, step, 10.0 + step)]):
                stall.process(frame)
        relaunch = [launch(0, 1, 20.0)]
        launched.note(relaunch)
        for frame in lifecycle_frames(relaunch):
            stall.process(frame)
        late = [step_sample(0, 0, 5, 19.9)]  # sent before the kill, received after
        assert ingest_samples(store, late, launched.current) == []
        assert stall.poll(25.0) == []
        assert set(stall.progress(25.0).values()) == {"unknown"}  # no step of its own yet
        fresh = ingest_samples(store, [step_sample(0, 1, 0, 26.0)], launched.current)
        assert [f.step for f in fresh] == [0]
    finally:
        store.close()
    with RunReader(tmp_path) as reader:
        steps = reader.samples(names=["step_time"])
    assert sorted(steps["step"]) == [0, 0, 1, 2, 3, 4, 5]


def test_samples_without_a_known_launch_or_attempt_are_current() -> None:
    launched = LaunchedAttempts()
    assert launched.current(step_sample(3, 0, 1, 1.0))
    launched.note([launch(3, 2, 2.0)])
    assert not launched.current(step_sample(3, 1, 1, 3.0))
    assert launched.current(step_sample(3, 2, 1, 3.0))
    assert launched.current(Sample("step_time", 0.05, 3.0, {"rank": "3"}, 1))
