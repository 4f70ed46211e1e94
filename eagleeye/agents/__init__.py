"""Agents and the controller across hosts: membership, heartbeats on the controller's
clock, and authenticated control (the job's shared secret on every message).

This is the protocol layer of ``eagleeye agent`` / ``eagleeye controller``
(docs/multihost.md): launching a host's ranks on an agent's side and acting on the
controller's decisions build on it, and so does the ranks' telemetry, reduced on each
host to one summary per step (``HostSummary``) that the controller's ``SummaryIntake``
takes.
"""

from __future__ import annotations

from typing import Any

from eagleeye.agents.link import AgentLink
from eagleeye.agents.membership import AgentLost, AgentReport, AgentState, Membership
from eagleeye.agents.summary import HostSummary, RankRow, Reduction, decode_summary, summarise
from eagleeye.agents.wire import Message, Refused, read_secret


def __getattr__(name: str) -> Any:
    if name == "SummaryIntake":  # numpy: imported only by who takes summaries
        from eagleeye.agents.intake import SummaryIntake

        return SummaryIntake
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AgentLink",
    "AgentLost",
    "AgentReport",
    "AgentState",
    "HostSummary",
    "Membership",
    "Message",
    "RankRow",
    "Reduction",
    "Refused",
    "SummaryIntake",
    "decode_summary",
    "read_secret",
    "summarise",
]
