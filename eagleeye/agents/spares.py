"""The spare hosts of a job across hosts.

An agent started with ``--spare`` says ``hello`` without a node rank (``node_rank`` -1):
admitted with the job's secret like any agent, it runs no ranks and is watched for loss
like the others. When a node rank's host is lost or evicted, or its agent leaves on a
signal (drained), the controller gives that node rank to the spare that joined first and
is still alive (``Spares.take``), and fences the host it replaces (``Membership.fence``).
With snapshots across hosts (``--snapshots``) the spare's holder takes the node's place
in the holders' ring: the spare must declare one in its hello, else it is refused
(``NO_HOLDER_REFUSAL``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from eagleeye.agents.membership import AgentState, Membership

#: What a spare without a snapshot holder that joins a controller run with
#: ``--snapshots`` is told.
NO_HOLDER_REFUSAL = (
    "eagleeye controller --snapshots needs a spare's snapshot holder, and this spare "
    "declared none (its --advertise address did not resolve); give the agent its address "
    "with --advertise"
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

    def ready(self) -> bool:
        """Whether a spare is waiting, alive and not fenced (``take`` would give one)."""
        return any(self._usable(name, state) for name, state in self._waiting.items())

    def _usable(self, name: str, state: AgentState) -> bool:
        current = self.members.agents.get(name)
        return current is state and state.lost_at is None and name not in self.members.fenced

    def take(self) -> AgentState | None:
        """The first spare still alive and not fenced, no longer waiting; None if none."""
        for name, state in list(self._waiting.items()):
            del self._waiting[name]  # used now, or gone
            if self._usable(name, state):
                return state
        return None

    def take_over(
        self,
        by_node: dict[int, AgentState],
        node: int,
        reason: str,
        lost: bool,
        goes_on: bool = True,
        drained: bool = False,
    ) -> AgentState | None:
        """The host of node rank ``node`` (in ``by_node``) out of the job for good, fenced
        for ``reason``: lost (when the job goes on with a spare, its stop names a new agent
        under which it joins again as a spare once its ranks ended), evicted (suspected
        hardware: it stays out) or ``drained`` (its agent left on a signal: its stop says
        so, and the host may join again as a spare, no readmission asked). The first
        spare alive is taken; unless the job cannot go
        on (``goes_on`` false: it is put back, first in line) it holds ``node`` from now
        on, in ``by_node`` and in the membership. Returns the spare taken; None if none."""
        held = by_node[node]
        spare = self.take()
        usable = spare is not None and goes_on
        again = self.members.new_name(held.host) if lost and usable else None
        if drained:
            self.members.fence(held.agent, reason, key="drained")
        else:
            self.members.fence(held.agent, reason, rejoin=again, evicted=not lost)
        if spare is not None and usable:
            self.members.assign(spare.agent, node)
            by_node[node] = spare
        elif spare is not None:
            self.put_back(spare)
        return spare

    def put_back(self, agent: AgentState) -> None:
        """A spare taken but not used (the restart budget was spent): first in line again."""
        self._waiting = {agent.agent: agent, **self._waiting}


__all__ = ["NO_HOLDER_REFUSAL", "Spares", "is_spare"]
