"""The replica protocol's records: every message round-trips, everything else is refused."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ft_runtime.membership import Membership
from ft_runtime.replica import protocol
from ft_runtime.replica.protocol import (
    CONTROL_FIELDS,
    KEY_FAMILIES,
    CatchUpDone,
    CatchUpRequest,
    CatchUpTicket,
    Command,
    ControlSlot,
    EpochBroken,
    EpochPointer,
    EpochStart,
    ExchangeSummary,
    Failed,
    Heartbeat,
    JoinRequest,
    LedgerMark,
    ProtocolError,
    Refused,
    Restored,
    Saved,
    ServerAddress,
    Skipped,
    decode,
    decode_answer,
    decode_counter,
    decode_membership,
    encode,
    encode_membership,
)

ROOT = Path(__file__).resolve().parents[3]

MESSAGES = [
    EpochPointer(7),
    EpochBroken("rank 3 exited"),
    EpochStart(40),
    JoinRequest(2, 1),
    Heartbeat(12, 40),
    ServerAddress("10.0.0.5", 41234),
    LedgerMark("trained"),
    LedgerMark("skipped"),
    CatchUpRequest(replica=1, incarnation=2, source=0),
    CatchUpTicket(3),
    CatchUpDone(3),
    Command(4, "rollback", step=40, replicas=(0, 2), lr_factor=0.5),
    Command(5, "checkpoint"),
]
ANSWERS = [
    Saved(40, "/ckpt/step-40"),
    Restored(30, 41, 0.5),
    Skipped(17),
    Refused("not the epoch's source"),
    Failed("no checkpoint at or before 3"),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips(message) -> None:
    assert decode(type(message), encode(message)) == message


@pytest.mark.parametrize("answer", ANSWERS, ids=lambda m: type(m).__name__)
def test_every_answer_variant_round_trips_through_one_decoder(answer) -> None:
    assert decode_answer(encode(answer)) == answer


def _tampered(message, **changes) -> str:
    data = json.loads(encode(message))
    data.update(changes)
    return json.dumps(data)


@pytest.mark.parametrize(
    ("kind", "raw", "complaint"),
    [
        (Heartbeat, _tampered(Heartbeat(1, 2), step=-1), "out of range"),
        (Heartbeat, _tampered(Heartbeat(1, 2), step=2.0), "not an integer"),
        (Heartbeat, _tampered(Heartbeat(1, 2), step=True), "not an integer"),
        (Heartbeat, _tampered(Heartbeat(1, 2), step=2**70), "out of range"),
        (Heartbeat, _tampered(Heartbeat(1, 2), v=2), "protocol version"),
        (Heartbeat, _tampered(Heartbeat(1, 2), time=1e9), "fields"),
        (Heartbeat, encode(EpochStart(3)), "got a 'start' message"),
        (Heartbeat, "12 1764000000.5", "not JSON"),
        (Heartbeat, "[12, 40]", "not a JSON object"),
        (Heartbeat, b"\xff\xfe", "not JSON"),
        (Heartbeat, "{" * 70000, "over the limit"),
        (Command, _tampered(Command(1, "rollback"), kind="rm -rf"), "unknown control command"),
        (Command, _tampered(Command(1, "rollback"), lr_factor="nan"), "finite"),
        (
            Command,
            '{"v":1,"t":"command","number":1,"kind":"rollback","step":1,'
            '"replicas":[],"lr_factor":Infinity}',
            "not JSON",
        ),
        (Command, _tampered(Command(1, "rollback"), lr_factor=-1.0), "lr_factor"),
        (Command, _tampered(Command(1, "rollback"), replicas=[0, "1"]), "not an integer"),
        (Command, _tampered(Command(1, "rollback"), replicas=5), "list"),
        (ServerAddress, _tampered(ServerAddress("h", 1), port=70000), "not a TCP port"),
        (LedgerMark, _tampered(LedgerMark("trained"), outcome="twice"), "outcome"),
        (EpochBroken, _tampered(EpochBroken("x"), reason="x" * 5000), "text"),
    ],
)
def test_anything_but_a_valid_message_is_refused_with_the_declared_error(
    kind, raw, complaint
) -> None:
    with pytest.raises(ProtocolError, match=re.escape(complaint)):
        decode(kind, raw)


def test_an_unknown_answer_kind_is_refused() -> None:
    with pytest.raises(ProtocolError, match="no answer kind"):
        decode_answer(encode(Heartbeat(1, 1)))


def test_counters_are_plain_counts_and_nothing_else() -> None:
    assert decode_counter(b"12") == 12
    for bad in (b"-1", b"1e3", b"", b"12 ", "٣".encode(), b"9" * 30):
        with pytest.raises(ProtocolError):
            decode_counter(bad)


def test_a_membership_is_checked_against_the_epoch_of_its_key() -> None:
    m = Membership(4, (0, 2, 3), (3,))
    assert decode_membership(4, encode_membership(m)) == m
    with pytest.raises(ProtocolError, match="under the key of epoch 5"):
        decode_membership(5, encode_membership(m))
    for members, joining in (((2, 0), ()), ((0, 0), ()), ((0, 1), (2,))):
        raw = encode_membership(Membership(4, members, joining))
        with pytest.raises(ProtocolError, match="inconsistent"):
            decode_membership(4, raw)


def test_the_control_vector_is_read_by_name() -> None:
    slots = [
        ControlSlot(contributed=True, batch=7, epoch_seen=3, step=40, commands_seen=2),
        None,
        ControlSlot(contributed=False, batch=0, epoch_seen=4, step=40, commands_seen=1),
    ]
    rows = [
        [0.0 if s is None else s.values()[i] for s in slots] for i in range(len(CONTROL_FIELDS))
    ]
    summary = ExchangeSummary.from_rows(rows)
    assert summary.slots == tuple(slots)
    assert (summary.members, summary.contributors) == (2, 1)
    assert (summary.epoch_agreed, summary.commands_agreed) == (4, 2)
    assert summary.trained() == [(0, 7)]
    assert summary.steps(40) == "aligned"
    assert summary.steps(39) == "behind"
    assert summary.steps(41) == "ahead"
    rows[1][0] = 7.5
    with pytest.raises(ProtocolError, match="not a count"):
        ExchangeSummary.from_rows(rows)
    rows[1][0] = math.inf
    with pytest.raises(ProtocolError, match="not a count"):
        ExchangeSummary.from_rows(rows)
    rows[1][0] = 7.0
    rows[CONTROL_FIELDS.index("present")][0] = 2.0  # two replicas wrote one column
    with pytest.raises(ProtocolError, match="not 0 or 1"):
        ExchangeSummary.from_rows(rows)


def test_docs_list_every_key_family_and_message() -> None:
    text = (ROOT / "docs" / "protocol.md").read_text()
    for family in KEY_FAMILIES:
        assert f"`{family.pattern}`" in text, family.pattern
        if family.message[0].isupper():
            assert f"`{family.message}`" in text, family.message
    for name in ("Saved", "Restored", "Skipped", "Refused", "Failed", *CONTROL_FIELDS):
        assert f"`{name}`" in text, name


def test_no_other_module_spells_a_store_key() -> None:
    """The key families live in protocol.py only: no f-string key elsewhere."""
    pattern = re.compile(r"""f?["'](q|hb|addr|data|ctl|x|intra)/""")
    offenders = []
    for path in (ROOT / "ft_runtime").rglob("*.py"):
        if path.name == "protocol.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    for path in (ROOT / "eagleeye" / "workload").rglob("*.py"):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders, offenders


def test_the_protocol_loads_without_torch() -> None:
    code = "import sys, ft_runtime.replica.protocol; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_the_module_exports_what_it_declares() -> None:
    for name in protocol.__all__:
        assert hasattr(protocol, name), name
