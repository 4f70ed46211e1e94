"""The controller's commands as a rank receives them, and its answers.

The controller writes command n under ``ctl/<n>`` and counts them in ``ctl/count``; every
rank reports the count it has seen in each exchange, and the largest over the members is
the agreed count, so every member runs the same commands after the same step. Rank 0 of
each replica answers under ``ctl/<n>/r<replica>`` with a typed answer. A command that does
not decode is never run: it is answered ``Failed`` by every member alike.
"""

from __future__ import annotations

from ft_runtime import _dist as dist
from ft_runtime.replica.protocol import (
    KEY_COMMANDS,
    Answer,
    Command,
    Failed,
    ProtocolError,
    decode,
    decode_counter,
    encode,
    key_answer,
    key_command,
)

__all__ = ["CommandInbox"]


class CommandInbox:
    """Commands agreed in the exchanges and not yet run by this rank.

    Commands issued before the inbox was made (before this incarnation started) are not
    this incarnation's: it starts at the current count.
    """

    def __init__(self, store: dist.Store, replica: int, writer: bool) -> None:
        self.store, self.replica, self.writer = store, replica, writer
        self.done = self.seen()
        self.agreed = self.done

    def seen(self) -> int:
        """How many commands the controller has written (this rank's vote)."""
        return decode_counter(str(self.store.add(KEY_COMMANDS, 0)))

    def agree(self, count: int) -> None:
        """The count the members agreed on in an exchange."""
        self.agreed = max(self.agreed, count)

    def take(self) -> list[Command]:
        """The agreed commands not run yet, in order; run them, then ``answer`` each."""
        pending = []
        for number in range(self.done + 1, self.agreed + 1):
            key = key_command(number)
            try:
                if not self.store.check([key]):
                    raise ProtocolError(f"command {number} is counted but absent")
                command = decode(Command, self.store.get(key))
                if command.number != number:
                    raise ProtocolError(f"command {command.number} stored as {number}")
            except ProtocolError as exc:  # never acted on; every member skips it alike
                self.answer(number, Failed(str(exc)))
                continue
            pending.append(command)
        self.done = self.agreed
        return pending

    def answer(self, number: int, answer: Answer) -> None:
        """Rank 0 of the replica tells the controller what command ``number`` did here."""
        if self.writer:
            self.store.set(key_answer(number, self.replica), encode(answer))
