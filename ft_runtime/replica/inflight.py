"""Control commands in flight: sent without waiting, their answers collected tick by tick.

The supervisor writes a command into the quorum's store and returns at once; each later
``poll`` looks (one non-blocking store check per replica still silent) for the answers of
the replicas that were healthy members when it was sent and still are. A command is over
when each of them answered, or when its deadline passed: the replicas that never answered
are named. The controller's tick never waits on a rank.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ft_runtime.replica.protocol import (
    KEY_COMMANDS,
    Answer,
    Command,
    Failed,
    ProtocolError,
    decode_answer,
    decode_counter,
    encode,
    key_answer,
    key_command,
)
from ft_runtime.types import Action


class CommandStore(Protocol):
    """What the commands need of the quorum's store (a ``TCPStore``)."""

    def add(self, key: str, value: int) -> int: ...

    def set(self, key: str, value: str) -> None: ...

    def check(self, keys: list[str]) -> bool: ...

    def get(self, key: str) -> bytes: ...


@dataclass(frozen=True, slots=True)
class Finished:
    """A command that is over: its answers by replica, and the replicas that owed one
    but gave none before the deadline (``timed_out``) or left the quorum meanwhile."""

    action: Action
    command: Command
    answers: dict[int, Answer]
    missing: tuple[int, ...]
    left: tuple[int, ...]
    timed_out: bool
    waited_s: float


@dataclass
class _Flight:
    action: Action
    command: Command
    owed: tuple[int, ...]
    sent_at: float
    deadline: float
    answers: dict[int, Answer] = field(default_factory=dict)


class InFlight:
    """The commands sent and not yet over.

    Args:
        timeout_s: how long a command waits for its answers.
        timer: monotonic seconds (deadlines never follow the wall clock).
    """

    def __init__(self, timeout_s: float, timer: Callable[[], float] = time.monotonic) -> None:
        self.timeout_s = timeout_s
        self.timer = timer
        self._flights: list[_Flight] = []

    def __len__(self) -> int:
        return len(self._flights)

    def send(
        self,
        store: CommandStore,
        action: Action,
        kind: str,
        members: tuple[int, ...],
        step: int = -1,
        replicas: tuple[int, ...] = (),
        lr_factor: float = 1.0,
    ) -> Command:
        """Writes the next command; every member runs it after the step whose exchange
        first carries it, and the members named here owe an answer."""
        number = decode_counter(str(store.add(KEY_COMMANDS, 0))) + 1
        command = Command(number, kind, step, replicas, lr_factor)
        store.set(key_command(command.number), encode(command))
        store.add(KEY_COMMANDS, 1)
        now = self.timer()
        self._flights.append(_Flight(action, command, members, now, now + self.timeout_s))
        return command

    def poll(self, store: CommandStore | None, members: tuple[int, ...]) -> list[Finished]:
        """Collects the answers that came; returns the commands now over. ``members``: the
        quorum's current members (a replica dropped meanwhile owes nothing)."""
        over: list[Finished] = []
        now = self.timer()
        for flight in list(self._flights):
            if store is not None:
                for replica in flight.owed:
                    key = key_answer(flight.command.number, replica)
                    if replica not in flight.answers and store.check([key]):
                        flight.answers[replica] = read_answer(store.get(key))
            silent = [r for r in flight.owed if r not in flight.answers]
            left = tuple(r for r in silent if r not in members)
            missing = tuple(r for r in silent if r in members)
            if missing and now < flight.deadline:
                continue
            self._flights.remove(flight)
            waited = now - flight.sent_at
            over.append(
                Finished(
                    flight.action,
                    flight.command,
                    dict(flight.answers),
                    missing,
                    left,
                    bool(missing),
                    waited,
                )
            )
        return over


def read_answer(raw: bytes) -> Answer:
    """The typed answer a replica wrote; a value that is no valid answer is that replica's
    failure (one bad answer must not take the controller down)."""
    try:
        return decode_answer(raw)
    except ProtocolError as exc:
        return Failed(f"unreadable answer: {exc}")


def answer_json(answer: Answer) -> dict[str, Any]:
    """An answer as structured data: its kind and its fields."""
    return {"kind": answer.KIND, **dataclasses.asdict(answer)}
