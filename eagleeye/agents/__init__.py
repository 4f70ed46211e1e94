"""Agents and the controller across hosts: membership, heartbeats on the controller's
clock, and authenticated control (the job's shared secret on every message).

This is the protocol layer of ``eagleeye agent`` / ``eagleeye controller``
(docs/multihost.md): launching a host's ranks on an agent's side and acting on the
controller's decisions build on it.
"""

from __future__ import annotations

from eagleeye.agents.link import AgentLink
from eagleeye.agents.membership import AgentLost, AgentReport, AgentState, Membership
from eagleeye.agents.wire import Message, Refused, read_secret

__all__ = [
    "AgentLink",
    "AgentLost",
    "AgentReport",
    "AgentState",
    "Membership",
    "Message",
    "Refused",
    "read_secret",
]
