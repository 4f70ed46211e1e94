"""Every rank's stacks across hosts, read by each host's agent when the controller
judges a hang (``--recovery job``), before anything acts on it.

The controller sends each agent of the job's node ranks a ``stacks`` request (over the
authenticated link: the job's secret, replays refused): a request number, how long the
capture may take and how many characters of a rank's stacks to keep. The agent reads its
ranks' stacks with the code ``eagleeye run`` uses (``eagleeye.stacks.StackCapture``:
py-spy, else the rank's faulthandler; a stopped rank without py-spy, or a rank that is
not running, is answered without a stack and why) and answers one ``stacks`` report per
rank, its text cut to the limit (``truncated``, which says so). The controller
(``StackGather``) waits for every rank or ``wait_s``, whichever comes first, so that the
policy's action (a restart that ends the ranks) comes after; the ranks of an agent that
did not answer in time, is lost, or whose answer broke the schema are recorded without a
stack, naming why. An answer that comes later is dropped (logged). Every field of both
messages is checked before it is used; what the controller received meanwhile is handed
back, in order, to be handled as usual.
"""

from __future__ import annotations

import logging
import math
import secrets
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagleeye.agents.membership import AgentReport, AgentState, Membership
from eagleeye.stacks import MAX_STACK_CHARS, RankStack, StackCapture, truncated
from ft_runtime.layout import JobLayout

log = logging.getLogger(__name__)

#: The message kind, both ways (the controller's request, the agent's answer per rank).
STACKS = "stacks"
#: The longest the controller waits for every host's stacks before acting on a hang.
STACK_WAIT_S = 5.0
#: The longest capture an agent runs, whatever it is asked (its loop waits meanwhile).
MAX_CAPTURE_S = 10.0
#: The fewest characters of a rank's stacks a request may ask to keep.
MIN_STACK_CHARS = 1000
METHODS = frozenset({"py-spy", "faulthandler", "none"})


@dataclass(frozen=True, slots=True)
class StackRequest:
    """A checked ``stacks`` request: its number, the capture's time limit, the most
    characters of a rank's stacks to keep."""

    request: int
    timeout_s: float
    max_chars: int

    @classmethod
    def parse(cls, body: Mapping[str, Any]) -> StackRequest:
        """Raises ValueError naming the field that is wrong."""
        request = _integer(body, "request", 0, 1 << 62)
        timeout = body.get("timeout_s")
        if isinstance(timeout, bool) or not isinstance(timeout, int | float):
            raise ValueError(f"timeout_s must be a number, not {timeout!r}")
        if not (math.isfinite(timeout) and 0 < timeout <= MAX_CAPTURE_S):
            raise ValueError(f"timeout_s must be over 0 and at most {MAX_CAPTURE_S:g}")
        max_chars = _integer(body, "max_chars", MIN_STACK_CHARS, MAX_STACK_CHARS)
        return cls(request, float(timeout), max_chars)

    def body(self) -> dict[str, Any]:
        return {"request": self.request, "timeout_s": self.timeout_s, "max_chars": self.max_chars}


def answer(
    request: StackRequest,
    ranks: Iterable[int],
    live: Mapping[int, int],
    run_dir: Path,
    host: str,
) -> list[dict[str, Any]]:
    """An agent's answers to ``request``: one per rank of ``ranks`` (its node's) and of
    ``live`` (rank -> pid of its running ranks), each rank's stacks read at once
    (``StackCapture``, ``run_dir``: where its ranks' faulthandler writes)."""
    read = StackCapture(run_dir, timeout_s=request.timeout_s).capture(live)
    stacks = {stack.rank: stack for stack in read}
    for rank in set(ranks) - set(live):
        why = f"no stacks: rank {rank} is not running on {host}"
        stacks[rank] = RankStack(rank, 0, "none", "?", why)
    return [
        {
            "request": request.request,
            "rank": stack.rank,
            "pid": stack.pid,
            "method": stack.method,
            "state": stack.state,
            "text": truncated(stack.text, request.max_chars),
        }
        for stack in sorted(stacks.values(), key=lambda s: s.rank)
    ]


@dataclass(frozen=True, slots=True)
class Gathered:
    """Every rank's stacks (in rank order, each naming its host) and what else the
    controller received while it waited (agents admitted, reports), in order."""

    stacks: tuple[RankStack, ...]
    held: tuple[AgentState | AgentReport, ...]


class StackGather:
    """The controller's side: asks the agents of the job's node ranks for their ranks'
    stacks and waits for them (``gather``).

    Args:
        members: the agents' membership (its socket is polled while waiting).
        wait_s: the longest wait for every answer.
        max_chars: the most characters of a rank's stacks kept.
    """

    def __init__(
        self, members: Membership, wait_s: float = STACK_WAIT_S, max_chars: int = MAX_STACK_CHARS
    ) -> None:
        self.members = members
        self.wait_s = wait_s
        self.max_chars = max_chars
        # numbered from a random start: a late answer to an earlier controller of the
        # job (restarted from its run store) is never taken for this one's
        self._request = secrets.randbelow(1 << 48)

    def gather(self, nodes: Mapping[int, AgentState], layout: JobLayout) -> Gathered:
        """Every rank's stacks: from its host's agent, else a row naming why there is none."""
        if self.wait_s <= 0:
            unasked = "no stacks: not asked for (the controller waits 0 s for them)"
            none = (
                _none(s.rank, nodes[s.node_rank].host if s.node_rank in nodes else "", unasked)
                for s in layout.ranks()
            )
            return Gathered(tuple(none), ())
        self._request += 1
        # the agent's capture ends well before the wait, so its answers can arrive in time
        ask = StackRequest(self._request, min(self.wait_s * 0.6, MAX_CAPTURE_S), self.max_chars)
        asked: dict[int, AgentState] = {}  # rank -> the agent asked for its stacks
        missing: dict[int, RankStack] = {}
        for node, agent in sorted(nodes.items()):
            ranks = [spec.rank for spec in layout.ranks() if spec.node_rank == node]
            why = self._unreachable(agent)
            if why is None and not self.members.send(agent.agent, STACKS, ask.body()):
                why = f"the agent {agent.agent} of {agent.host} could not be asked (not connected)"
            for rank in ranks:
                if why is None:
                    asked[rank] = agent
                else:
                    missing[rank] = _none(rank, agent.host, f"no stacks: {why}")
        got: dict[int, RankStack] = {}
        held: list[AgentState | AgentReport] = []
        deadline = time.monotonic() + self.wait_s
        while asked.keys() - got.keys() - missing.keys():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for item in self.members.poll(timeout_s=min(left, 0.05)):
                if isinstance(item, AgentReport) and item.kind == STACKS:
                    self._take(item, asked, got, missing)
                else:
                    held.append(item)
        for rank, agent in asked.items():
            if rank not in got and rank not in missing:
                why = (
                    f"no stacks: the agent {agent.agent} of {agent.host} did not answer "
                    f"within {self.wait_s:g} s (an answer after that is dropped)"
                )
                missing[rank] = _none(rank, agent.host, why)
        every = {**missing, **got}
        return Gathered(tuple(every[rank] for rank in sorted(every)), tuple(held))

    def _unreachable(self, agent: AgentState) -> str | None:
        if agent.agent in self.members.fenced:
            return f"the agent {agent.agent} of {agent.host} is out of the job (fenced)"
        if agent.lost_at is not None:
            return f"the agent {agent.agent} of {agent.host} is lost"
        return None

    def _take(
        self,
        report: AgentReport,
        asked: Mapping[int, AgentState],
        got: dict[int, RankStack],
        missing: dict[int, RankStack],
    ) -> None:
        """One answer: its rank's stacks when every field holds, else the rank is
        recorded without them and why (or, when no rank of its agent can be told, the
        answer is logged and dropped)."""
        body = report.body
        if body.get("request") != self._request or isinstance(body.get("request"), bool):
            self.late(report)
            return
        rank = body.get("rank")
        agent = asked.get(rank) if isinstance(rank, int) and not isinstance(rank, bool) else None
        if agent is None or agent.agent != report.agent:
            log.warning(
                "refused the stacks of %s: rank %r is not one of its node's; not used",
                report.agent,
                rank,
            )
            return
        assert isinstance(rank, int)
        if rank in got or rank in missing:
            return  # answered already: the first answer stands
        try:
            got[rank] = _stack(rank, body, agent.host, self.max_chars)
        except ValueError as exc:
            why = f"no stacks: the answer of {agent.agent} on {agent.host} was refused: {exc}"
            log.warning("%s", why)
            missing[rank] = _none(rank, agent.host, why)

    def late(self, report: AgentReport) -> None:
        """A ``stacks`` answer that came after its hang was acted on: logged, dropped."""
        log.info(
            "dropped the stacks of rank %r from %s: they came after the wait (request %r)",
            report.body.get("rank"),
            report.agent,
            report.body.get("request"),
        )


def _stack(rank: int, body: Mapping[str, Any], host: str, max_chars: int) -> RankStack:
    pid = _integer(body, "pid", 0, 1 << 32)
    method = body.get("method")
    if method not in METHODS:
        raise ValueError(f"method must be one of {sorted(METHODS)}, not {method!r}")
    state = body.get("state")
    if not isinstance(state, str) or len(state) != 1 or not state.isprintable():
        raise ValueError(f"state must be one printable character, not {state!r}")
    text = body.get("text")
    if not isinstance(text, str):
        raise ValueError(f"text must be a string, not {type(text).__name__}")
    return RankStack(rank, pid, str(method), state, truncated(text, max_chars), host)


def _none(rank: int, host: str, why: str) -> RankStack:
    return RankStack(rank, 0, "none", "?", why, host)


def _integer(body: Mapping[str, Any], key: str, low: int, high: int) -> int:
    value = body.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{key} must be an integer from {low} to {high}, not {value!r}")
    return value


__all__ = [
    "MAX_CAPTURE_S",
    "STACKS",
    "STACK_WAIT_S",
    "Gathered",
    "StackGather",
    "StackRequest",
    "answer",
]
