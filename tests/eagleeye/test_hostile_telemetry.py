"""Forged and malformed telemetry never crashes the controller, never reaches a detector
and never triggers an action; what is dropped is counted in the store."""

from __future__ import annotations

import math
import textwrap
import time

import pytest

from collector.types import Sample
from eagleeye.ingest import ingest_samples
from eagleeye.launch import JobConfig, run_job
from eagleeye.store import RunReader, RunStore

LABELS = {"rank": "0", "replica": "0", "node": "node0", "attempt": "0"}

FORGER = textwrap.dedent(
    """
    import json, os, time
    import zmq
    from collector.transport import encode, sign

    key = os.environ["EAGLEEYE_TELEMETRY_KEY"].encode()
    push = zmq.Context.instance().socket(zmq.PUSH)
    push.connect(os.environ["EAGLEEYE_TELEMETRY"])
    now = time.time()
    ok = {"rank": "0", "replica": "0", "node": "node0", "attempt": "0"}

    def signed(labels, *rows):
        payload = encode(labels, list(rows))
        push.send_multipart([payload, sign(key, payload)])

    push.send(json.dumps({"v": 1, "labels": {"replica": "x"},
                          "samples": [["step_time", 0.1, now, 1]]}).encode())  # unsigned
    signed({**ok, "replica": "x"}, ["step_time", 0.1, now, 1])
    signed(ok, ["step_time", 0.1, now, 10**30])
    signed(ok, ["step_time", 0.1, 0.0, 2])  # time far in the past: a fake hang
    signed(ok, ["event.checkpoint", float("nan"), now, 3, {"tier": "disk"}])
    signed(ok, ["event.checkpoint", float("inf"), now, 3, {"tier": "disk"}])
    signed(ok, ["event.checkpoint", 4.0, now, 4, {"tier": "disk", "seconds": "abc"}])
    signed(ok, ["step_time", 0.1, now, 5])
    time.sleep(1.0)
    push.close(linger=2000)
    """
)


def test_hostile_checkpoint_events_are_dropped_and_the_rest_stored(tmp_path) -> None:
    now = time.time()
    store = RunStore(tmp_path)
    try:
        samples = [
            Sample("event.checkpoint", math.nan, now, {**LABELS, "tier": "disk"}, 1),
            Sample("event.checkpoint", math.inf, now, {**LABELS, "tier": "disk"}, 1),
            Sample("event.checkpoint", 1e30, now, {**LABELS, "tier": "disk"}, 1),
            Sample("event.restore", 2.0, now, {**LABELS, "seconds": "nan"}, 2),
            Sample("event.checkpoint", 3.0, now, {**LABELS, "seconds": "abc", "bytes": "9" * 30}),
            Sample("event.fault", 1.0, now, {**LABELS, "rank": "x", "kind": "kill"}, 1),
            Sample("step_time", 0.1, now, LABELS, 4),
        ]
        frames = ingest_samples(store, samples)
    finally:
        store.close()
    assert [f.step for f in frames] == [4]
    with RunReader(tmp_path) as reader:
        checkpoints = reader.checkpoints()
        assert sorted(checkpoints["step"]) == [2, 3]
        assert checkpoints["seconds"].isna().all()
        assert checkpoints["bytes"].isna().all()
        assert list(reader.faults()["rank"].isna()) == [True]
        assert list(reader.samples(names=["step_time"])["step"]) == [4]


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_rank_forging_telemetry_changes_nothing_and_is_counted(tmp_path) -> None:
    script = tmp_path / "forger.py"
    script.write_text(FORGER)
    config = JobConfig(str(script), runs_dir=str(tmp_path / "runs"), instrument=False)
    result = run_job(config)
    assert result.succeeded
    with RunReader(result.run_dir) as reader:
        assert reader.findings().empty
        assert reader.actions().empty
        assert reader.meta()["telemetry_rejected"] == {"auth": 1, "schema": 2, "clock": 1}
        assert list(reader.checkpoints()["step"]) == [4]
        assert list(reader.samples(names=["step_time"])["step"]) == [5]
