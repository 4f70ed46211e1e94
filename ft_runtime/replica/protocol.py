"""The replica-recovery protocol: every key of the quorum's store, and every message in it.

This module is the one place that names the store's keys and encodes what is written under
them. It needs no torch: the controller, the ranks and the tests share it. Every message is
a frozen, versioned record; ``encode`` writes it as a small JSON object (ASCII text) and ``decode``
checks every field (its type, its range, that numbers are finite, the protocol version and
the message kind) and raises ``ProtocolError`` on anything else, so nothing read from the
store is acted on before it has been validated. docs/protocol.md lists the keys and the
messages.

>>> decode(Heartbeat, encode(Heartbeat(seq=3, step=40)))
Heartbeat(seq=3, step=40)
>>> decode(Heartbeat, b'{"v": 1, "t": "heartbeat", "seq": 3, "step": 1.5}')
Traceback (most recent call last):
...
ft_runtime.replica.protocol.ProtocolError: heartbeat: step '1.5' is not an integer
"""

from __future__ import annotations

import json
import math
import typing
from dataclasses import dataclass, fields
from typing import Any, ClassVar, TypeVar

from ft_runtime.membership import Membership

__all__ = [
    "ANSWERS",
    "CHECKPOINT",
    "COMMAND_KINDS",
    "MAX_INT",
    "ROLLBACK",
    "SKIPPED",
    "SKIP_BATCH",
    "TRAINED",
    "CONTROL_FIELDS",
    "KEY_CATCHUP_COUNT",
    "KEY_COMMANDS",
    "KEY_EPOCH",
    "KEY_FAMILIES",
    "KEY_STORE_LEASE",
    "KEY_STORE_STOP",
    "PROTOCOL_VERSION",
    "Answer",
    "CatchUpDone",
    "CatchUpRequest",
    "CatchUpTicket",
    "Command",
    "ControlSlot",
    "EpochBroken",
    "EpochPointer",
    "EpochStart",
    "ExchangeSummary",
    "Failed",
    "Heartbeat",
    "JoinRequest",
    "KeyFamily",
    "LedgerMark",
    "Membership",
    "ProtocolError",
    "Refused",
    "Restored",
    "Saved",
    "ServerAddress",
    "Skipped",
    "decode",
    "decode_answer",
    "decode_counter",
    "decode_membership",
    "encode",
    "encode_membership",
    "first_beat",
    "key_address",
    "key_answer",
    "key_broken",
    "key_catchup",
    "key_catchup_done",
    "key_catchup_ticket",
    "key_command",
    "key_heartbeat",
    "key_join",
    "key_ledger",
    "key_members",
    "key_start",
    "prefix_cross",
    "prefix_intra",
    "prefix_user",
]

PROTOCOL_VERSION = 1
"""Bumped on any change of a message's fields; a reader refuses other versions."""

MAX_INT = 2**62
"""Largest step, batch, epoch or counter the protocol accepts."""
MAX_TEXT = 4096
"""Longest text field (reasons, errors, paths), in characters."""
MAX_VALUE_BYTES = 64 * 1024
"""Longest encoded message; anything longer is refused unread."""
MAX_REPLICAS = 4096


class ProtocolError(ValueError):
    """A value in the quorum's store is not a valid message of the expected kind."""


# ---- keys ---------------------------------------------------------------------------------
KEY_EPOCH = "q/epoch"
KEY_STORE_STOP = "storehost/stop"
"""Set by the controller that ends a job across hosts: the detached store process ends."""
KEY_STORE_LEASE = "storehost/lease"
"""Renewed by a live controller; a detached store nobody renews for its lease ends."""
KEY_CATCHUP_COUNT = "q/wants"
KEY_COMMANDS = "ctl/count"


def key_members(epoch: int) -> str:
    return f"q/{epoch}/members"


def key_broken(epoch: int) -> str:
    return f"q/{epoch}/broken"


def key_start(epoch: int) -> str:
    return f"q/{epoch}/start"


def key_join(replica: int) -> str:
    return f"q/join/{replica}"


def key_heartbeat(rank: int) -> str:
    return f"hb/{rank}"


def key_address(rank: int) -> str:
    return f"addr/{rank}"


def key_ledger(replica: int, batch: int) -> str:
    return f"data/{replica}/{batch}"


def key_catchup(number: int) -> str:
    return f"q/want/{number}"


def key_catchup_ticket(replica: int, incarnation: int) -> str:
    return f"q/want/{replica}/{incarnation}"


def key_catchup_done(number: int) -> str:
    return f"q/want/{number}/done"


def key_command(number: int) -> str:
    return f"ctl/{number}"


def key_answer(number: int, replica: int) -> str:
    return f"ctl/{number}/r{replica}"


def prefix_intra(replica: int, incarnation: int) -> str:
    """Store prefix under which a replica's internal gloo group meets (gloo's own keys)."""
    return f"intra/{replica}/{incarnation}"


def prefix_user(replica: int, incarnation: int) -> str:
    """Store prefix of the script's own process group inside a replica (``ddp``)."""
    return f"user/{replica}/{incarnation}"


def prefix_cross(epoch: int, replica_rank: int) -> str:
    """Store prefix of the cross-replica group of one epoch, per replica rank."""
    return f"x/{epoch}/{replica_rank}"


@dataclass(frozen=True, slots=True)
class KeyFamily:
    """One family of keys: its pattern, what is stored there, who writes and who reads."""

    pattern: str
    message: str
    writer: str
    reader: str


KEY_FAMILIES: tuple[KeyFamily, ...] = (
    KeyFamily(KEY_EPOCH, "EpochPointer", "coordinator", "ranks"),
    KeyFamily("q/<e>/members", "Membership", "coordinator", "ranks"),
    KeyFamily("q/<e>/broken", "EpochBroken", "coordinator", "ranks"),
    KeyFamily("q/<e>/start", "EpochStart", "source rank", "coordinator, joiner"),
    KeyFamily("q/join/<r>", "JoinRequest", "joiner rank 0", "coordinator"),
    KeyFamily("hb/<rank>", "Heartbeat", "rank", "coordinator"),
    KeyFamily("addr/<rank>", "ServerAddress", "rank", "joiner"),
    KeyFamily("data/<r>/<b>", "LedgerMark", "rank 0 of each member", "ranks, checkpoints"),
    KeyFamily(KEY_CATCHUP_COUNT, "counter", "joiner rank 0", "source ranks"),
    KeyFamily("q/want/<n>", "CatchUpRequest", "joiner rank 0", "source ranks"),
    KeyFamily("q/want/<r>/<i>", "CatchUpTicket", "joiner rank 0", "joiner ranks"),
    KeyFamily("q/want/<n>/done", "CatchUpDone", "joiner rank 0", "source ranks"),
    KeyFamily(KEY_COMMANDS, "counter", "controller", "ranks"),
    KeyFamily("ctl/<n>", "Command", "controller", "ranks"),
    KeyFamily("ctl/<n>/r<r>", "Answer", "rank 0 of replica r", "controller"),
    KeyFamily("intra/<r>/<i>/...", "gloo's own", "gloo", "gloo"),
    KeyFamily("x/<e>/<rr>/...", "gloo's own", "gloo", "gloo"),
    KeyFamily("user/<r>/<i>/...", "torch's own", "torch.distributed", "torch.distributed"),
    KeyFamily(KEY_STORE_LEASE, "any bytes", "controller", "the detached store process"),
    KeyFamily(KEY_STORE_STOP, "any bytes", "controller", "the detached store process"),
)


# ---- messages -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class EpochPointer:
    """``q/epoch``: the newest epoch the coordinator published."""

    KIND: ClassVar[str] = "epoch"
    epoch: int


@dataclass(frozen=True, slots=True)
class EpochBroken:
    """``q/<e>/broken``: a member of epoch e died or was isolated; abort its collectives."""

    KIND: ClassVar[str] = "broken"
    reason: str


@dataclass(frozen=True, slots=True)
class EpochStart:
    """``q/<e>/start``: the step of epoch e's first exchange (the joiners' first step)."""

    KIND: ClassVar[str] = "start"
    step: int


@dataclass(frozen=True, slots=True)
class JoinRequest:
    """``q/join/<r>``: replica r's ranks are caught up and ready, as this incarnation."""

    KIND: ClassVar[str] = "join"
    replica: int
    incarnation: int


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """``hb/<rank>``: the rank entered the exchange of ``step``; ``seq`` counts the beats,
    from ``first_beat(incarnation)`` on.

    It carries no time: the receiver notes when it saw a new ``seq`` on its own clock, so
    ranks on hosts with skewed clocks are judged right. A beat whose ``seq`` is below one
    already seen is an old value put back and is ignored, so a relaunched rank counts on
    from above every beat of the process before it (which may still write one after the
    quorum forgot it: a whole-job restart stops the ranks without waiting for them)."""

    KIND: ClassVar[str] = "heartbeat"
    seq: int
    step: int


def first_beat(incarnation: int) -> int:
    """The ``seq`` a rank of ``incarnation`` counts its heartbeats from: above every beat
    of an earlier incarnation (2**32 beats each)."""
    return incarnation << 32


@dataclass(frozen=True, slots=True)
class ServerAddress:
    """``addr/<rank>``: where the rank's snapshot server listens."""

    KIND: ClassVar[str] = "address"
    host: str
    port: int

    def __post_init__(self) -> None:
        _check(self, not 0 < self.port < 65536, f"port {self.port} is not a TCP port")
        _check(self, not self.host or any(c.isspace() for c in self.host), "empty host")

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @classmethod
    def parse(cls, address: str) -> ServerAddress:
        host, _, port = address.rpartition(":")
        if not port.isdigit():
            raise ProtocolError(f"address: {address!r} is not host:port")
        return cls(host.strip("[]"), int(port))


TRAINED, SKIPPED = "trained", "skipped"


@dataclass(frozen=True, slots=True)
class LedgerMark:
    """``data/<r>/<b>``: batch b of replica r was consumed, trained or skipped."""

    KIND: ClassVar[str] = "ledger"
    outcome: str

    def __post_init__(self) -> None:
        _check(self, self.outcome not in (TRAINED, SKIPPED), f"outcome {self.outcome!r}")


@dataclass(frozen=True, slots=True)
class CatchUpRequest:
    """``q/want/<n>``: request n: ``replica`` (as ``incarnation``) wants ``source``'s state."""

    KIND: ClassVar[str] = "catchup"
    replica: int
    incarnation: int
    source: int


@dataclass(frozen=True, slots=True)
class CatchUpTicket:
    """``q/want/<r>/<i>``: the number of the request incarnation i of replica r made."""

    KIND: ClassVar[str] = "ticket"
    number: int


@dataclass(frozen=True, slots=True)
class CatchUpDone:
    """``q/want/<n>/done``: the joiner of request n trained its first step: stop logging."""

    KIND: ClassVar[str] = "catchup_done"
    number: int


CHECKPOINT, ROLLBACK, SKIP_BATCH = "checkpoint", "rollback", "skip_batch"
COMMAND_KINDS = (CHECKPOINT, ROLLBACK, SKIP_BATCH)


@dataclass(frozen=True, slots=True)
class Command:
    """``ctl/<n>``: ``checkpoint`` (the lowest healthy replica saves), ``rollback`` to the
    newest checkpoint at or before ``step`` (the learning rate then multiplied by
    ``lr_factor``), ``skip_batch`` (``replicas`` skip their next batch; empty means all).

    >>> c = Command(3, "rollback", step=40, replicas=(0, 2))
    >>> decode(Command, encode(c)) == c
    True
    """

    KIND: ClassVar[str] = "command"
    number: int
    kind: str
    step: int = -1
    replicas: tuple[int, ...] = ()
    lr_factor: float = 1.0

    def __post_init__(self) -> None:
        if self.kind not in COMMAND_KINDS:
            raise ProtocolError(
                f"unknown control command {self.kind!r}; use one of {COMMAND_KINDS}"
            )
        _check(self, not -1 <= self.step <= MAX_INT, f"step {self.step} is out of range")
        _check(self, not 0 < self.lr_factor <= 1e6, f"lr_factor {self.lr_factor} not in (0, 1e6]")

    def applies_to(self, replica: int) -> bool:
        return not self.replicas or replica in self.replicas


@dataclass(frozen=True, slots=True)
class Saved:
    """Answer: this replica saved the checkpoint of ``step`` at ``path``."""

    KIND: ClassVar[str] = "saved"
    step: int
    path: str


@dataclass(frozen=True, slots=True)
class Restored:
    """Answer: this replica rolled back from ``from_step`` to the checkpoint of ``step``;
    its learning-rate factor is now ``lr_factor``."""

    KIND: ClassVar[str] = "restored"
    step: int
    from_step: int
    lr_factor: float

    def __post_init__(self) -> None:
        _check(self, not self.lr_factor > 0, f"lr_factor {self.lr_factor} is not positive")


@dataclass(frozen=True, slots=True)
class Skipped:
    """Answer: this replica skipped its batch ``batch``."""

    KIND: ClassVar[str] = "skipped"
    batch: int


@dataclass(frozen=True, slots=True)
class Refused:
    """Answer: the command does not apply here (not the saving replica, not targeted)."""

    KIND: ClassVar[str] = "refused"
    reason: str


@dataclass(frozen=True, slots=True)
class Failed:
    """Answer: the command applied here and failed; training goes on."""

    KIND: ClassVar[str] = "failed"
    error: str


Answer = Saved | Restored | Skipped | Refused | Failed
"""``ctl/<n>/r<r>``: what command n did on replica r."""
ANSWERS: tuple[type[Answer], ...] = (Saved, Restored, Skipped, Refused, Failed)

Message = (
    EpochPointer
    | EpochBroken
    | EpochStart
    | JoinRequest
    | Heartbeat
    | ServerAddress
    | LedgerMark
    | CatchUpRequest
    | CatchUpTicket
    | CatchUpDone
    | Command
    | Answer
)
M = TypeVar("M", bound=Message)

# Fields that may hold -1 ("none"), by message kind; every other integer is in [0, MAX_INT].
_SIGNED_BY_KIND = {"command": {"step"}, "restored": {"step", "from_step"}}


def _check(record: object, bad: bool, what: str) -> None:
    if bad:
        raise ProtocolError(f"{getattr(record, 'KIND', type(record).__name__)}: {what}")


# ---- encoding -----------------------------------------------------------------------------
def encode(message: Message) -> str:
    """The message as the (ASCII) text stored under its key."""
    data: dict[str, Any] = {"v": PROTOCOL_VERSION, "t": message.KIND}
    for f in fields(message):
        value = getattr(message, f.name)
        data[f.name] = list(value) if isinstance(value, tuple) else value
    return json.dumps(data, separators=(",", ":"), allow_nan=False)


def decode(kind: type[M], raw: bytes | str) -> M:
    """The message of type ``kind`` stored as ``raw``; ProtocolError if it is not one."""
    data = _load(raw, kind.KIND)
    if data["t"] != kind.KIND:
        raise ProtocolError(f"{kind.KIND}: got a {str(data['t'])[:40]!r} message instead")
    return _build(kind, data)


def decode_answer(raw: bytes | str) -> Answer:
    """A command answer, whichever of its variants it is."""
    data = _load(raw, "answer")
    for kind in ANSWERS:
        if data["t"] == kind.KIND:
            return _build(kind, data)
    raise ProtocolError(f"answer: {str(data['t'])[:40]!r} is no answer kind")


def decode_counter(raw: bytes | str) -> int:
    """A counter kept by the store's ``add`` (``q/wants``, ``ctl/count``)."""
    text = raw.decode("ascii", "replace") if isinstance(raw, bytes) else raw
    if not text.isascii() or not text.isdigit() or len(text) > 19 or int(text) > MAX_INT:
        raise ProtocolError(f"counter: {text[:40]!r} is not a count")
    return int(text)


def encode_membership(membership: Membership) -> str:
    data = {
        "v": PROTOCOL_VERSION,
        "t": "membership",
        "epoch": membership.epoch,
        "members": list(membership.members),
        "joining": list(membership.joining),
    }
    return json.dumps(data, separators=(",", ":"))


def decode_membership(epoch: int, raw: bytes | str) -> Membership:
    """Epoch ``epoch``'s membership; its members sorted and distinct, joiners among them."""
    data = _load(raw, "membership")
    if data["t"] != "membership" or set(data) != {"v", "t", "epoch", "members", "joining"}:
        raise ProtocolError(f"membership: not a membership message: {sorted(data)}")
    got = _int(data["epoch"], "membership", "epoch", 0)
    members = _ints(data["members"], "membership", "members")
    joining = _ints(data["joining"], "membership", "joining")
    if got != epoch:
        raise ProtocolError(f"membership: says epoch {got} under the key of epoch {epoch}")
    if list(members) != sorted(set(members)) or not set(joining) <= set(members):
        raise ProtocolError(f"membership: members {members} / joining {joining} inconsistent")
    return Membership(epoch, members, joining)


def _load(raw: bytes | str, what: str) -> dict[str, Any]:
    if len(raw) > MAX_VALUE_BYTES:
        raise ProtocolError(f"{what}: {len(raw)} bytes, over the limit of {MAX_VALUE_BYTES}")
    try:
        data = json.loads(raw, parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"{what}: not JSON ({exc})"[:200]) from None
    if not isinstance(data, dict):
        raise ProtocolError(f"{what}: not a JSON object")
    if data.get("v") != PROTOCOL_VERSION or type(data.get("v")) is not int:
        raise ProtocolError(
            f"{what}: protocol version {str(data.get('v'))[:20]}, this side speaks "
            f"{PROTOCOL_VERSION}; run one version of Eagle Eye across the job"
        )
    if not isinstance(data.get("t"), str):
        raise ProtocolError(f"{what}: no message kind")
    return data


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number")


def _build(kind: type[M], data: dict[str, Any]) -> M:
    names = [f.name for f in fields(kind)]
    if set(data) != {"v", "t", *names}:
        raise ProtocolError(f"{kind.KIND}: fields {sorted(set(data) - {'v', 't'})}, want {names}")
    hints = typing.get_type_hints(kind)
    signed = _SIGNED_BY_KIND.get(kind.KIND, set())
    values: dict[str, Any] = {}
    for name in names:
        value, hint = data[name], hints[name]
        if hint is int:
            values[name] = _int(value, kind.KIND, name, -1 if name in signed else 0)
        elif hint is float:
            values[name] = _float(value, kind.KIND, name)
        elif hint is str:
            if not isinstance(value, str) or len(value) > MAX_TEXT:
                raise ProtocolError(f"{kind.KIND}: {name} is not a text of <= {MAX_TEXT}")
            values[name] = value
        else:  # tuple[int, ...]
            values[name] = _ints(value, kind.KIND, name)
    try:
        return kind(**values)
    except ProtocolError:
        raise
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"{kind.KIND}: {exc}"[:300]) from None


def _int(value: object, what: str, name: str, low: int) -> int:
    if type(value) is not int:
        raise ProtocolError(f"{what}: {name} {str(value)[:40]!r} is not an integer")
    if not low <= value <= MAX_INT:
        raise ProtocolError(f"{what}: {name} {value} is out of range [{low}, {MAX_INT}]")
    return value


def _float(value: object, what: str, name: str) -> float:
    if type(value) not in (int, float) or not math.isfinite(float(value)):  # type: ignore[arg-type]
        raise ProtocolError(f"{what}: {name} {str(value)[:40]!r} is not a finite number")
    return float(value)  # type: ignore[arg-type]


def _ints(value: object, what: str, name: str) -> tuple[int, ...]:
    if not isinstance(value, list) or len(value) > MAX_REPLICAS:
        raise ProtocolError(f"{what}: {name} is not a list of <= {MAX_REPLICAS} integers")
    return tuple(_int(v, what, name, 0) for v in value)


# ---- the per-exchange control vector --------------------------------------------------------
CONTROL_FIELDS = ("contributed", "batch", "epoch_seen", "step", "present", "commands_seen")
"""Rows of the control vector that rides on every cross-replica all-reduce, one column per
replica: each member fills its own column, the sum gives every member all of them."""


@dataclass(frozen=True, slots=True)
class ControlSlot:
    """One replica's column of the control vector."""

    contributed: bool
    batch: int
    epoch_seen: int
    step: int
    present: bool = True
    commands_seen: int = 0

    def values(self) -> tuple[float, ...]:
        return tuple(float(getattr(self, name)) for name in CONTROL_FIELDS)


@dataclass(frozen=True, slots=True)
class ExchangeSummary:
    """The summed control vector, read by name: what every member told the others."""

    slots: tuple[ControlSlot | None, ...]
    """Per replica, its column, or None for a replica absent from the exchange."""

    @classmethod
    def from_rows(cls, rows: typing.Sequence[typing.Sequence[float]]) -> ExchangeSummary:
        """Validates the summed rows (``len(CONTROL_FIELDS)`` rows of one value per
        replica); ProtocolError if a value is not a whole, finite, in-range number."""
        if len(rows) != len(CONTROL_FIELDS) or len({len(r) for r in rows}) != 1:
            raise ProtocolError(f"control vector: want {len(CONTROL_FIELDS)} equal rows")
        slots: list[ControlSlot | None] = []
        for column in zip(*rows, strict=True):
            values = {}
            for name, value in zip(CONTROL_FIELDS, column, strict=True):
                if not math.isfinite(value) or value != int(value) or not 0 <= value <= MAX_INT:
                    raise ProtocolError(f"control vector: {name} {value!r} is not a count")
                values[name] = int(value)
            if values["present"] not in (0, 1) or values["contributed"] not in (0, 1):
                raise ProtocolError(f"control vector: flags {values} are not 0 or 1")
            if not values["present"]:
                slots.append(None)
                continue
            slots.append(
                ControlSlot(
                    bool(values["contributed"]),
                    values["batch"],
                    values["epoch_seen"],
                    values["step"],
                    True,
                    values["commands_seen"],
                )
            )
        return cls(tuple(slots))

    @property
    def present(self) -> tuple[ControlSlot, ...]:
        return tuple(s for s in self.slots if s is not None)

    @property
    def members(self) -> int:
        return len(self.present)

    @property
    def contributors(self) -> int:
        return sum(s.contributed for s in self.present)

    @property
    def epoch_agreed(self) -> int:
        """The newest epoch any member has seen: every member moves to it next."""
        return max((s.epoch_seen for s in self.present), default=0)

    @property
    def commands_agreed(self) -> int:
        return max((s.commands_seen for s in self.present), default=0)

    def steps(self, step: int) -> str:
        """``aligned`` when every member is at ``step``, ``behind`` when one is past it
        (this side missed a commit), ``ahead`` otherwise."""
        steps = [s.step for s in self.present]
        if any(s > step for s in steps):
            return "behind"
        return "aligned" if all(s == step for s in steps) else "ahead"

    def trained(self) -> list[tuple[int, int]]:
        """``(replica, batch)`` of every replica that contributed a gradient."""
        return [
            (replica, slot.batch)
            for replica, slot in enumerate(self.slots)
            if slot is not None and slot.contributed
        ]
