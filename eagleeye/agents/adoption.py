"""A node's agent saying ``hello`` again while the job runs: its ranks adopted.

It happens when the agent's link came back (a new connection) and, above all, when the
controller was restarted from its run store (``eagleeye.agents.resume``): the agent kept
its ranks running and declares them in its hello (``resume``: its attempt, each rank's
pid and the exit code of those that ended meanwhile). The controller takes the agent
back only as the very agent process it had admitted for that node rank (the same name
and session, sealed with the job's secret like every message): anyone else is refused,
and the node is answered as a lost host (a spare takes it, else the job stops). Of the
agent it takes back:

- ranks of the current attempt are adopted as they run, never relaunched; the exits
  that happened while the controller was away are answered now, as any exit;
- an agent still on an earlier attempt missed the launch of the current one (the
  controller wrote it ahead and died before telling every agent): it is sent again;
- an agent on a later attempt than the controller knows is refused (a store behind
  the agents: nothing of it is trusted).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from eagleeye.agents.membership import AgentLost, AgentState
from ft_runtime.types import Phase

if TYPE_CHECKING:
    from eagleeye.agents.coordinator import JobCoordinator

log = logging.getLogger(__name__)


def adopt(job: JobCoordinator, held: AgentState, agent: AgentState) -> None:
    """``agent`` said hello for the node rank ``held`` (of the same name) holds."""
    node = held.node_rank
    if held.session and agent.session != held.session:
        if not job.restored:  # as before: an agent restarted under the same name joins
            _take(job, node, agent)
            return
        why = (
            f"{agent.agent} came back as a new process (not the session this job admitted); "
            "the ranks of its node cannot be adopted"
        )
        _refuse(job, held, agent, why)
        return
    resume = agent.info.get("resume")
    declared = resume if isinstance(resume, Mapping) else {}
    attempt = declared.get("attempt")
    if isinstance(attempt, int) and attempt > job.attempt:
        why = f"{agent.agent} runs attempt {attempt}, later than this job's {job.attempt}"
        _refuse(job, held, agent, why)
        return
    _take(job, node, agent)
    ranks = declared_ranks(declared.get("ranks"))
    if attempt != job.attempt:
        job.members.send(agent.agent, "restart", {**job.launch_body, "node_rank": node})
        job._event(
            f"agent:{agent.agent}",
            Phase.RUNNING,
            host=agent.host,
            node=node,
            adopted=False,
            relaunched=True,
            declared_attempt=attempt,
        )
        return
    pids = {str(r["rank"]): r["pid"] for r in ranks if r.get("code") is None}
    job._event(
        f"agent:{agent.agent}", Phase.RUNNING, host=agent.host, node=node, adopted=True, pids=pids
    )
    for rank in ranks:  # exits while the controller was away (or not yet told)
        code = rank.get("code")
        if isinstance(code, int) and job.phase is Phase.RUNNING:
            job._exit(agent.agent, int(rank["rank"]), code, attempt)


def _take(job: JobCoordinator, node: int, agent: AgentState) -> None:
    job._by_node[node] = agent
    job.on_joined(agent)


def _refuse(job: JobCoordinator, held: AgentState, agent: AgentState, why: str) -> None:
    """Not adopted: its node is answered as a lost host (a spare takes it, else the job
    stops), and the agent is fenced, told to end its ranks."""
    log.warning("not adopted: %s", why)
    job._event(f"agent:{agent.agent}", Phase.EXITED, host=agent.host, reason=why)
    job._host_lost(
        AgentLost(agent.agent, agent.host, held.node_rank, held.last_seen, job.clock(), 0)
    )


def declared_ranks(value: Any) -> list[dict[str, Any]]:
    """The ranks an agent's hello declares that make sense: a rank number, a pid, an exit
    code or None, and the incarnation it runs under (``attempt``, None when not said)."""
    if not isinstance(value, list):
        return []
    out = []
    for row in value:
        if not isinstance(row, Mapping):
            continue
        rank, pid, code, attempt = (row.get(k) for k in ("rank", "pid", "code", "attempt"))
        if _is_int(rank) and _is_int(pid) and (code is None or _is_int(code)):
            out.append({"rank": rank, "pid": pid, "code": code, "attempt": attempt})
    return out


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


__all__ = ["adopt", "declared_ranks"]
