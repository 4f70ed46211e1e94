"""Host summaries opened many at a time, as the controller takes a drained socket: the MAC
is the HMAC-SHA256 of the job's secret (as every agent message); the vectorised parse
accepts and refuses exactly what the one-by-one parse does; a tampered, cut, oversized,
unsound or replayed summary among many is refused and counted and the others taken."""

from __future__ import annotations

import hashlib
import hmac
import math
import struct

import numpy as np
import pytest

from eagleeye.agents import Membership, Refused
from eagleeye.agents.intake import SummaryIntake
from eagleeye.agents.summary import (
    _HEADER,
    MAX_SUMMARY_BYTES,
    SummaryMac,
    encode_summary,
    parse_payload,
    stats_sound,
    summarise,
    summary_mac,
)
from eagleeye.agents.summarybatch import HEADER, MIN_BATCH, parse_payloads
from eagleeye.agents.wire import Message, seal
from ft_runtime.layout import JobLayout

SECRET = b"0123456789abcdef0123456789abcdef"
HOSTS = 24


def host(node: int, step: int, slow: bool = False, extra: bool = False, whole: bool = False):
    values = {}
    for rank in range(8 * node, 8 * node + 8):
        compute = 300.0 if slow and rank % 8 == 3 else 100.0 + rank % 3
        compute = 250.0 if whole else compute
        values[rank] = {"compute_ms": compute, "step_time": 0.2 + rank % 2 * 1e-3}
        if extra:
            values[rank]["loss"] = 2.0
    return summarise(step, 0, values)


def payloads(step: int = 1) -> list[bytes]:
    """A step of HOSTS hosts: most alike, one with a slow rank, one with more metrics, one
    slow as a whole (it stands out against the other hosts)."""
    out = []
    for node in range(HOSTS):
        summary = host(node, step, slow=node == 5, extra=node == 7, whole=node == 11)
        out.append(encode_summary(summary, SECRET, f"{node:016x}", 10 + step)[0])
    return out


def test_the_mac_is_hmac_sha256_of_the_secret_as_for_every_agent_message() -> None:
    for key in (b"k" * 16, SECRET, b"x" * 64, b"long" * 40):
        mac = SummaryMac(key)
        for payload in (b"", b"EEHS", bytes(range(256)) * 4):
            assert mac(payload) == hmac.digest(key, payload, hashlib.sha256)
            assert mac.verify(payload, mac(payload))
            assert not mac.verify(payload, mac(payload + b"!"))
    payload, tag = encode_summary(host(0, 1), SECRET, "00" * 8, 1)
    _, json_tag = seal(SECRET, Message("heartbeat", "a", "00" * 8, 1))
    assert tag == hmac.digest(SECRET, payload, "sha256")
    assert len(tag) == len(json_tag)
    assert HEADER.itemsize == _HEADER.size


def test_a_batch_round_trips_as_each_message_alone() -> None:
    sent = payloads()
    blocks, refused = parse_payloads(sent)
    assert refused == []
    seen = {}
    for block in blocks:
        for j, at in enumerate(block.index.tolist()):
            rows = block.rows[j] if block.rows else ()
            seen[at] = (int(block.steps[j]), int(block.ranks[j]), block.names, rows)
            alone = parse_payload(sent[at])
            assert block.stats[j].tobytes() == alone[6]
            assert (int(block.steps[j]), int(block.ranks[j]), block.names, rows) == (
                alone[2],
                alone[4],
                alone[5],
                alone[7],
            )
    assert sorted(seen) == list(range(HOSTS))
    assert [r.rank for r in seen[5][3]] == [43]  # the slow rank's row came through
    assert seen[7][2] == ("compute_ms", "loss", "step_time")
    assert max(len(b) for b in blocks) == HOSTS - 2  # the alike ones, in one pass


def mutations(payload: bytes) -> list[bytes]:
    """The payload broken field by field (each then sealed with the right key)."""
    fields = _HEADER.unpack_from(payload)
    out = []
    for k, bad in (
        (0, b"EEHX"),
        (1, 1),
        (1, 3),
        (4, -1),
        (6, 0),
        (6, 1 << 17),
        (7, 13),
        (7, 15),
        (8, 1),
        (9, fields[9] - 1),
        (9, fields[9] + 1),
    ):
        changed = list(fields)
        changed[k] = bad
        out.append(_HEADER.pack(*changed) + payload[_HEADER.size :])
    names_at = _HEADER.size
    out.append(payload[:names_at] + b"\xff" + payload[names_at + 1 :])  # not UTF-8
    out.append(payload[:names_at] + b"X" + payload[names_at + 1 :])  # another vocabulary
    stats_at = len(payload) - 40 * fields[7]
    nan = struct.pack("<d", math.nan)
    out.append(payload[: stats_at + 8] + nan + payload[stats_at + 16 :])  # a NaN median
    low_above = struct.pack("<d", 1e9)
    out.append(payload[: stats_at + 16] + low_above + payload[stats_at + 24 :])  # min > median
    out.append(payload[: stats_at + 32] + struct.pack("<d", -1.0) + payload[stats_at + 40 :])
    out.append(payload[:-1])  # cut
    out.append(payload[:20])  # shorter than the header
    out.append(payload + b"\0")  # a byte too many
    out.append(payload + b"\0" * MAX_SUMMARY_BYTES)  # oversized
    return out


def test_the_vectorised_parse_refuses_exactly_what_the_one_by_one_parse_refuses() -> None:
    good = payloads()
    broken = mutations(good[0])
    # the broken ones among alike good ones, and each kind also as a batch of its own
    for batch in (good[:MIN_BATCH] + broken + good[MIN_BATCH:], broken * MIN_BATCH):
        blocks, refused = parse_payloads(batch)
        expected = set()
        for at, payload in enumerate(batch):
            try:
                parsed = parse_payload(payload)
            except Refused:
                expected.add(at)
                continue
            if not stats_sound(parsed[6], parsed[4]):
                expected.add(at)
        assert {at for at, _ in refused} == expected
        assert all(why.reason == "schema" for _, why in refused)
        taken = np.concatenate([b.index for b in blocks]).tolist()
        assert sorted(taken) == sorted(set(range(len(batch))) - expected)
    # every mutation is refused but the other vocabulary, a sound summary of its own
    assert len(expected) == (len(broken) - 1) * MIN_BATCH


def admitted(intake: SummaryIntake | None = None) -> Membership:
    members = Membership(SECRET, "tcp://127.0.0.1:0")
    members.intake = intake
    for node in range(HOSTS):
        hello = Message("hello", f"agent-{node}", f"{node:016x}", 1, {"node_rank": node})
        members.receive([f"h{node}".encode(), *seal(SECRET, hello)])
    return members


def test_among_many_a_tampered_cut_oversized_or_replayed_summary_is_refused_and_counted():
    intake = SummaryIntake(JobLayout(nnodes=HOSTS, nproc_per_node=8), clock=lambda: 0.0)
    members = admitted(intake)
    mac = summary_mac(SECRET)
    try:
        messages = []
        for node, payload in enumerate(payloads()):
            tag = mac(payload)
            if node == 2:  # a byte flipped in flight
                payload = payload[:-1] + bytes([payload[-1] ^ 1])
            elif node == 3:  # cut, sealed with the right key
                payload = payload[:-8]
                tag = mac(payload)
            elif node == 4:  # oversized, sealed with the right key
                payload = payload + b"\0" * MAX_SUMMARY_BYTES
                tag = mac(payload)
            messages.append([f"h{node}".encode(), payload, tag])
        messages.append(messages[0])  # node 0's summary again: a replay
        messages.append([b"stranger", *messages[1][1:]])  # a connection never admitted
        members.receive_all(messages)
        assert members.refused == {"auth": 1, "schema": 2, "replay": 1, "not_admitted": 1}
        assert intake.summaries == HOSTS - 3
        members.receive_all(messages[5:12])  # the same again, alone in a later batch
        assert members.refused["replay"] == 1 + 7
        (job,) = [f for f in intake.frames(hosts=HOSTS - 3) if f.subject.scope == "job"]
        assert job.values["hosts_reporting"] == HOSTS - 3
        assert job.values["compute_ms.max"] == 300.0  # node 5's slow rank
    finally:
        members.close()


def test_unsound_statistics_among_many_are_refused_before_the_intake_sees_them() -> None:
    intake = SummaryIntake(JobLayout(nnodes=HOSTS, nproc_per_node=8), clock=lambda: 0.0)
    members = admitted(intake)
    mac = summary_mac(SECRET)
    try:
        messages = []
        for node, payload in enumerate(payloads()):
            if node == 9:  # an infinite maximum, sealed with the right key
                at = len(payload) - 40 + 24
                payload = payload[:at] + struct.pack("<d", math.inf) + payload[at + 8 :]
            messages.append([f"h{node}".encode(), payload, mac(payload)])
        members.receive_all(messages)
        assert members.refused == {"schema": 1}
        assert intake.summaries == HOSTS - 1
    finally:
        members.close()


def test_a_summary_where_none_is_taken_is_refused() -> None:
    members = admitted(None)
    try:
        sent = payloads()
        members.receive_all(
            [[f"h{n}".encode(), p, summary_mac(SECRET)(p)] for n, p in enumerate(sent)]
        )
        assert members.refused == {"unexpected": HOSTS}
    finally:
        members.close()


@pytest.mark.parametrize("count", [1, MIN_BATCH - 1, MIN_BATCH, 3 * MIN_BATCH])
def test_one_message_or_many_the_intake_gets_the_same(count: int) -> None:
    sent = payloads()[:count]
    one = SummaryIntake(JobLayout(nnodes=HOSTS, nproc_per_node=8), clock=lambda: 0.0)
    many = SummaryIntake(JobLayout(nnodes=HOSTS, nproc_per_node=8), clock=lambda: 0.0)
    a, b = admitted(one), admitted(many)
    try:
        messages = [[f"h{n}".encode(), p, summary_mac(SECRET)(p)] for n, p in enumerate(sent)]
        for message in messages:
            a.receive(message)
        b.receive_all(messages)
        frames_one, frames_many = one.frames(hosts=count), many.frames(hosts=count)
        if count > 11:  # host 11 stands out, in the big block of hosts alike
            assert "node node11" in [str(f.subject) for f in frames_many]
        assert [(f.subject, f.values) for f in frames_one] == [
            (f.subject, f.values) for f in frames_many
        ]
    finally:
        a.close()
        b.close()


def test_an_agents_messages_are_handled_in_its_order_among_other_agents_heartbeats() -> None:
    intake = SummaryIntake(JobLayout(nnodes=HOSTS, nproc_per_node=8), clock=lambda: 0.0)
    members = admitted(intake)
    mac = summary_mac(SECRET)
    try:
        messages = []
        for node in range(HOSTS):
            session = f"{node:016x}"
            for step, seq in ((1, 2), (2, 4)):  # seq 3: a heartbeat between them
                payload = encode_summary(host(node, step), SECRET, session, seq)[0]
                messages.append([f"h{node}".encode(), payload, mac(payload)])
                if seq == 2:
                    beat = Message("heartbeat", f"agent-{node}", session, 3)
                    messages.append([f"h{node}".encode(), *seal(SECRET, beat)])
        late = Message("hello", "agent-new", "ffff000000000000", 1, {"node_rank": HOSTS - 1})
        messages.insert(5, [b"new", *seal(SECRET, late)])  # a hello among them
        payload = encode_summary(host(HOSTS - 1, 1), SECRET, "ffff000000000000", 2)[0]
        messages.insert(6, [b"new", payload, mac(payload)])
        members.receive_all(messages)
        assert members.refused == {}
        assert intake.summaries == 2 * HOSTS + 1
    finally:
        members.close()


def test_a_lost_agents_summaries_are_refused_until_it_says_hello_again() -> None:
    now = [0.0]
    members = Membership(SECRET, "tcp://127.0.0.1:0", period_s=1.0, clock=lambda: now[0])
    members.intake = intake = SummaryIntake(JobLayout(nnodes=HOSTS, nproc_per_node=8))
    mac = summary_mac(SECRET)
    try:
        for node in range(HOSTS):
            hello = Message("hello", f"agent-{node}", f"{node:016x}", 1, {"node_rank": node})
            members.receive([f"h{node}".encode(), *seal(SECRET, hello)])
        now[0] = 1.0
        assert members.lost() == []  # pinged
        now[0] = 3.5
        assert len(members.lost()) == HOSTS  # silent despite the pings
        sent = [(node, p, mac(p)) for node, p in enumerate(payloads())]
        members.receive_all([[f"h{n}".encode(), p, t] for n, p, t in sent])
        assert members.refused == {"not_admitted": HOSTS}
        assert intake.summaries == 0
        again = Message("hello", "agent-3", "0123456789abcdef", 1, {"node_rank": 3})
        members.receive([b"h3", *seal(SECRET, again)])
        payload = encode_summary(host(3, 2), SECRET, "0123456789abcdef", 2)[0]
        members.receive_all([[f"h{n}".encode(), p, t] for n, p, t in sent[:3]])
        members.receive_all([[b"h3", payload, mac(payload)]])
        assert members.refused == {"not_admitted": HOSTS + 3}
        assert intake.summaries == 1
    finally:
        members.close()
