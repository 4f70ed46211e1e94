"""The spare hosts of a job across hosts.

An agent started with ``--spare`` says ``hello`` without a node rank (``node_rank`` -1):
admitted with the job's secret like any agent, it runs no ranks and is watched for loss
like the others. When a node rank's host is lost or evicted, the controller gives that
node rank to the spare that joined first and is still alive (``Spares.take``), and fences
the host it replaces (``Membership.fence``). Snapshots across hosts (``--snapshots``) do
not take spares: the holders' ring names every node rank's host, and rebuilding it around
a new host (its holder, the backups the lost host held) is not built, so a spare that
joins such a controller is refused (``SNAPSHOTS_REFUSAL``) rather than half-served.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from eagleeye.agents.membership import AgentState, Membership

#: What a spare that joins a controller run with ``--snapshots`` is told.
SNAPSHOTS_REFUSAL = (
    "eagleeye controller --snapshots does not take spare hosts (the holders' ring cannot "
    "be rebuilt around a new host yet); run the agent with --node-rank, or the "
    "controller without --snapshots"
)


def is_spare(agent: AgentState) -> bool:
    """Whether an admitted agent joined as a spare (no node rank)."""
    return agent.node_rank < 0


@dataclass
class Spares:
    """The spares admitted and not yet used, in the order they joined.

    Args:
        members: the agents' membership (who is alive, who is fenced).
    """

    members: Membership
    _waiting: dict[str, AgentState] = field(default_factory=dict)

    def join(self, agent: AgentState) -> None:
        """A spare admitted (again: a restarted spare replaces its earlier self)."""
        self._waiting.pop(agent.agent, None)
        self._waiting[agent.agent] = agent

    def drop(self, agent: str) -> bool:
        """Forgets a spare (it was lost); False when ``agent`` was no waiting spare."""
        return self._waiting.pop(agent, None) is not None

    def take(self) -> AgentState | None:
        """The first spare still alive and not fenced, no longer waiting; None if none."""
        for name, state in list(self._waiting.items()):
            current = self.members.agents.get(name)
            if current is not state or state.lost_at is not None or name in self.members.fenced:
                del self._waiting[name]
                continue
            del self._waiting[name]
            return state
        return None

    def put_back(self, agent: AgentState) -> None:
        """A spare taken but not used (the restart budget was spent): first in line again."""
        self._waiting = {agent.agent: agent, **self._waiting}


__all__ = ["SNAPSHOTS_REFUSAL", "Spares", "is_spare"]
