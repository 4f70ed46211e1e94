"""Telemetry reduced on the host: a step's summary keeps the host's statistics and the raw
values of the ranks that stand out; the binary message round-trips, and a forged, cut,
replayed or unsound one is refused; across real sockets the controller's intake turns
summaries into the outliers' rank frames, the job's frame and the frames of hosts that
stand out against the others, and its detectors name a rank slow step after step."""

from __future__ import annotations

import math
import struct
import time

import pytest
import zmq

from collector.types import Subject
from eagleeye.agents import AgentLink, Membership, Refused
from eagleeye.agents.intake import SummaryIntake
from eagleeye.agents.summary import (
    HostSummary,
    decode_summary,
    encode_summary,
    parse_summary,
    stats_sound,
    summarise,
    summary_mac,
)
from eagleeye.detection import reduced_detectors
from ft_runtime.layout import JobLayout

SECRET = b"0123456789abcdef0123456789abcdef"
KEY = SECRET
SESSION = "0011223344556677"


def host_step(step: int, slow: int | None = None, nan: int | None = None, base: int = 0):
    values = {}
    for rank in range(base, base + 8):
        compute = 300.0 if rank == slow else 100.0 + rank % 3
        values[rank] = {"compute_ms": compute, "step_time": 0.2 + rank % 2 * 1e-3}
        values[rank]["loss"] = math.nan if rank == nan else 2.0
    return summarise(step, 0, values)


def test_a_summary_keeps_the_statistics_and_the_ranks_that_stand_out() -> None:
    summary = host_step(7, slow=3, nan=5)
    assert summary.names == ("compute_ms", "loss", "step_time")
    assert summary.ranks == 8
    assert summary.stat("compute_ms", "median") == 101.0
    assert summary.stat("compute_ms", "max") == 300.0
    assert summary.stat("loss", "count") == 7.0  # the NaN is no statistic
    assert [row.rank for row in summary.outliers] == [3, 5]
    assert summary.outliers[0].values["compute_ms"] == 300.0
    assert math.isnan(summary.outliers[1].values["loss"])
    assert host_step(7).outliers == ()  # a healthy host sends statistics only

    frames = encode_summary(summary, KEY, SESSION, 12)
    sealed, back = decode_summary(KEY, frames)
    assert (sealed.session, sealed.seq) == (SESSION, 12)
    assert (back.step, back.names, back.stats) == (7, summary.names, summary.stats)
    assert back.outliers[0] == summary.outliers[0]
    assert len(frames[0]) < 400  # 8 ranks in a few hundred bytes


def test_a_forged_cut_or_unsound_summary_is_refused() -> None:
    payload, mac = encode_summary(host_step(1, slow=2), KEY, SESSION, 1)
    with pytest.raises(Refused) as forged:
        decode_summary(b"another secret of the right size", [payload, mac])
    assert forged.value.reason == "auth"
    flipped = payload[:-1] + bytes([payload[-1] ^ 1])
    with pytest.raises(Refused, match="MAC"):
        decode_summary(KEY, [flipped, mac])
    for cut in (payload[:30], payload[:-3], payload + b"\0"):  # sealed with the right key
        with pytest.raises(Refused) as broken:
            decode_summary(KEY, encode_frames(cut))
        assert broken.value.reason == "schema"
    # a median above the maximum, sealed with the right key: refused as unsound
    summary = host_step(1)
    stats = list(struct.unpack(f"<{len(summary.stats) // 8}d", summary.stats))
    stats[1] = stats[3] + 1.0
    bad = HostSummary(1, 0, 8, summary.names, struct.pack(f"<{len(stats)}d", *stats))
    with pytest.raises(Refused, match="statistics"):
        decode_summary(KEY, encode_summary(bad, KEY, SESSION, 2))
    infinite = HostSummary(1, 0, 8, ("x",), struct.pack("<5d", 1.0, math.inf, 0.0, 9.0, 0.0))
    assert stats_sound(summary.stats, 8)
    assert not stats_sound(bad.stats, 8)
    assert not stats_sound(infinite.stats, 8)
    assert not stats_sound(summary.stats, 2)  # counts above the ranks


def encode_frames(payload: bytes) -> list[bytes]:
    return [payload, summary_mac(KEY)(payload)]


def test_the_intake_reduces_hosts_to_outliers_the_job_and_the_hosts_that_stand_out() -> None:
    layout = JobLayout(nnodes=4, nproc_per_node=8)
    intake = SummaryIntake(layout, clock=lambda: 100.0)
    for node in range(4):
        summary = host_step(3, slow=9 if node == 1 else None, base=8 * node)
        if node == 2:  # the whole host is slow: no rank of it stands out on its own
            values = {8 * node + r: {"compute_ms": 250.0, "step_time": 0.2} for r in range(8)}
            summary = summarise(3, 0, values)
        parsed = parse_summary(KEY, *encode_summary(summary, KEY, SESSION, node + 1))
        intake.take(node, parsed, 300, 100.0)
    early = intake.frames(hosts=5)  # the step waits for a fifth host; the row is out
    assert [f.subject.rank for f in early] == [9]
    frames = intake.frames(hosts=4)
    assert [str(f.subject) for f in frames] == ["node node2", "job"]
    node, job = frames
    assert node.values["compute_ms.median"] == 250.0
    assert job.values["compute_ms.max"] == 300.0
    assert (job.values["ranks_reporting"], job.values["hosts_reporting"]) == (32.0, 4.0)
    row = parse_summary(KEY, *encode_summary(host_step(4, slow=3), KEY, SESSION, 9))
    with pytest.raises(Refused, match="rank 3"):  # node rank 1 naming node 0's rank
        intake.take(1, row, 300, 100.0)


def test_the_intake_refuses_a_host_whose_statistics_are_unsound() -> None:
    now = [0.0]
    intake = SummaryIntake(JobLayout(nnodes=3, nproc_per_node=8), clock=lambda: now[0])
    for node in range(3):
        summary = host_step(5, base=8 * node)
        if node == 1:  # a median above the maximum, sealed with the right key
            stats = list(struct.unpack(f"<{len(summary.stats) // 8}d", summary.stats))
            stats[1] = stats[3] + 1.0
            packed = struct.pack(f"<{len(stats)}d", *stats)
            summary = HostSummary(5, 0, 8, summary.names, packed)
        intake.take(node, parse_summary(KEY, *encode_summary(summary, KEY, SESSION, 1)), 0, 0.0)
    assert intake.frames(hosts=3) == []  # refused at once: the step waits for a third host
    now[0] = intake.wait_s
    (job,) = intake.frames(hosts=3)
    assert intake.refused["schema"] == 1
    assert (job.values["hosts_reporting"], job.values["hosts_missing"]) == (2.0, 1.0)


def test_steps_go_out_in_order_when_a_host_never_sends_an_older_one() -> None:
    """A host whose ranks began a step later than the others never sends the first step:
    that step is reduced with the newer one that every host sent, before it, not released
    once it waited ``wait_s`` after steps that came later (a step going back reads as a
    restart to the controller's detectors, whose warm-up would start again)."""
    layout = JobLayout(nnodes=3, nproc_per_node=8)
    intake = SummaryIntake(layout, clock=lambda: 0.0)
    for step in (10, 11, 12):
        for node in range(3):
            if step == 10 and node == 2:
                continue
            summary = host_step(step, base=8 * node)
            intake.take(
                node, parse_summary(KEY, *encode_summary(summary, KEY, SESSION, step)), 0, 0.0
            )
    frames = intake.frames(hosts=3)
    assert [(f.step, f.values["hosts_reporting"]) for f in frames] == [
        (10, 2.0),
        (11, 3.0),
        (12, 3.0),
    ]
    assert [m.step for m in intake.take_medians()] == [10, 11, 12]
    late = parse_summary(KEY, *encode_summary(host_step(10, base=16), KEY, SESSION, 13))
    intake.take(2, late, 0, 0.0)
    assert intake.frames(hosts=3) == []
    assert intake.refused["late"] == 1


def test_the_outlier_rows_go_out_at_once_with_the_hosts_median() -> None:
    intake = SummaryIntake(JobLayout(nnodes=2, nproc_per_node=8), clock=lambda: 0.0)
    parsed = parse_summary(KEY, *encode_summary(host_step(3, slow=9, base=8), KEY, SESSION, 1))
    intake.take(1, parsed, 300, 0.0)
    (row,) = intake.frames(hosts=2)
    assert row.subject == Subject(replica=0, rank=9, node="node1")
    assert (row.values["compute_ms"], row.values["compute_ms.host_median"]) == (300.0, 101.5)


def test_summaries_cross_real_sockets_and_a_slow_rank_is_found() -> None:
    layout = JobLayout(nnodes=1, nproc_per_node=8)
    members = Membership(SECRET, "tcp://127.0.0.1:0", period_s=0.2)
    members.intake = intake = SummaryIntake(layout, clock=time.time)
    link = AgentLink(members.address, SECRET, agent="a0", node_rank=0, period_s=0.2).start()
    detectors = reduced_detectors()
    found = []
    try:
        wait_for(lambda: members.poll(0.05) or members.agents)
        for step in range(5):
            link.summary(host_step(step, slow=6))
        frames: list = []
        wait_for(lambda: (members.poll(0.05), True)[1] and intake.summaries == 5)
        frames = intake.frames(hosts=1)
        for frame in frames:
            for detector in detectors:
                found += detector.process(frame)
        # replayed (the same frames again) and from a connection never admitted: refused
        payload = encode_summary(host_step(9), SECRET, link.session, 3)
        intruder = zmq.Context.instance().socket(zmq.DEALER)
        intruder.connect(members.address)
        intruder.send_multipart(payload)
        link._socket.send_multipart(payload)  # seq 3 of the agent's session: a replay
        wait_for(lambda: (members.poll(0.05), True)[1] and members.refused["replay"] >= 1)
        wait_for(lambda: (members.poll(0.05), True)[1] and members.refused["not_admitted"])
        intruder.close(linger=0)
    finally:
        link.close()
        members.close()
    assert intake.summaries == 5
    # named at its fourth step standing out (the live comparison's three of five, held two)
    assert [(f.kind, f.subject.rank, f.step) for f in found] == [("slow_rank", 6, 3)]
    assert len([f for f in frames if f.subject.rank == 6]) == 5


def wait_for(check, limit: float = 10.0):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.02)
    raise AssertionError("not seen in time")


def test_an_agent_keeps_the_raw_series_and_summarises_a_step_once_every_rank_ended_it(
    tmp_path,
) -> None:
    from collector.transport import TelemetryPublisher
    from eagleeye.agents.ranktelemetry import HostTelemetry
    from eagleeye.config import ENV_TELEMETRY, ENV_TELEMETRY_KEY

    telemetry = HostTelemetry(tmp_path, wait_s=30.0)
    telemetry.expect([4, 5, 6])
    key = telemetry.env[ENV_TELEMETRY_KEY].encode()
    publisher = TelemetryPublisher(telemetry.env[ENV_TELEMETRY], key=key)
    now = time.time()
    try:
        for rank in (4, 5, 6, 9):  # rank 9 is not this host's: dropped
            labels = {"rank": str(rank), "replica": "0", "node": "node1", "attempt": "0"}
            publisher.send(labels, [["in_collective", 0.1, now, 7]])  # a progress report
        got = wait_for(lambda: telemetry.take()[0] or telemetry.foreign)
        assert got == 1  # no summary yet: no rank has ended step 7
        for rank in (4, 5, 6):
            labels = {"rank": str(rank), "replica": "0", "node": "node1", "attempt": "0"}
            compute = 0.3 if rank == 5 else 0.1
            rows = [["step_time", 0.5, now, 7], ["collective_time", 0.5 - compute, now, 7]]
            publisher.send(labels, [*rows, ["event.checkpoint", 7.0, now, None]])
        summaries, events = [], []

        def taken() -> bool:
            more, evs = telemetry.take()
            summaries.extend(more)
            events.extend(evs)
            return bool(summaries) and len(events) == 3

        wait_for(taken)
    finally:
        publisher.close()
        telemetry.close()
    (summary,) = summaries
    assert (summary.step, summary.ranks) == (7, 3)
    assert "in_collective" not in summary.names  # progress reports stay on the host
    assert summary.stat("compute_ms", "median") == pytest.approx(100.0)
    assert [row.rank for row in summary.outliers] == [5]
    raw = (tmp_path / "telemetry.jsonl").read_text().splitlines()
    assert len(raw) == 3 + 3 * 3  # every sample of the host's ranks, raw


def test_the_raw_series_file_is_rotated_at_its_size_and_only_the_newest_kept(tmp_path) -> None:
    import json

    from collector.transport import TelemetryPublisher
    from eagleeye.agents.ranktelemetry import HostTelemetry
    from eagleeye.config import ENV_TELEMETRY, ENV_TELEMETRY_KEY

    with pytest.raises(ValueError, match="raw_max_bytes"):
        HostTelemetry(tmp_path / "bad", raw_max_bytes=0)
    telemetry = HostTelemetry(tmp_path, wait_s=0.0, raw_max_bytes=1000, raw_keep=2)
    telemetry.expect([0])
    key = telemetry.env[ENV_TELEMETRY_KEY].encode()
    publisher = TelemetryPublisher(telemetry.env[ENV_TELEMETRY], key=key)
    labels = {"rank": "0", "replica": "0", "node": "node0", "attempt": "0"}
    try:
        for step in range(40):  # about 150 bytes a sample: several rotations
            publisher.send(labels, [["step_time", 0.5, time.time(), step]])
            wait_for(lambda s=step: telemetry.take() is not None and _has_step(tmp_path, s))
    finally:
        publisher.close()
        telemetry.close()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["telemetry.jsonl", "telemetry.jsonl.1", "telemetry.jsonl.2"]
    steps = []
    for name in ("telemetry.jsonl.2", "telemetry.jsonl.1", "telemetry.jsonl"):
        path = tmp_path / name
        if name != "telemetry.jsonl":
            assert 1000 <= path.stat().st_size < 1000 + 200  # rotated at its size
        steps += [json.loads(line)["step"] for line in path.read_text().splitlines()]
    assert steps == list(range(steps[0], 40))  # the newest, in order, none lost among them
    assert steps[0] > 0  # the oldest are gone


def _has_step(folder, step: int) -> bool:
    import json

    for path in folder.iterdir():
        for line in path.read_text().splitlines():
            if json.loads(line)["step"] == step:
                return True
    return False
