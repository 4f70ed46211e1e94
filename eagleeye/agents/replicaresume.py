"""A replica job across hosts survives its controller: its journal, and the adoption of
its ranks (``eagleeye controller --recovery replica`` killed and started again with the
same command line).

What lives on without the controller: the ranks (their agents keep them running), the
quorum's store (a process of its own on the controller's host, ``DetachedStore``: the
ranks keep exchanging through it) and the run store, which holds the quorum's membership
log (every epoch, recorded before it is published) and this journal: ``save`` writes the
coordinator's state into the run store's ``meta`` table (key ``replica_state``, JSON; no
schema change) whenever it changed, at the end of each of the controller's ticks. It
holds the store process's address and pid, the agent of every node rank (name, host, the
session of its hello), the agents fenced and evicted, and the supervisor's bookkeeping:
its attempt, restarts and full-job restarts, each replica's incarnation, restarts paid
and phase, each rank's current process (incarnation, whether it ended and how) and the
launcher's (which agent runs which rank, as which incarnation, the exits not yet read).

``restore`` puts that back into a new coordinator: it reconnects to the store process
(refused in one line when nothing answers there, the controller's host lost, or when its
process is not on this host, the controller started on another host), resumes the quorum
from its membership log (the same epochs, the joiners it expected), and expects every
agent back (a fresh heartbeat window each). ``adopt`` takes an agent's ranks back as it
says ``hello`` again: the very agent process it had admitted (the same name and
session), whose ranks of the current incarnation are adopted as they run, never
relaunched; those that ended while the controller was away are answered now, as any exit
(their replica restarts, paid from its budget); a rank the agent does not run as the
journal says (the controller died between starting it and its journal) counts as ended
and its replica restarts. Anyone else is refused, its node answered as a lost host. The
detectors, the hosts' reduced telemetry, the remediation policy's cooldowns and the
commands in flight (a checkpoint asked for just before the kill) start afresh.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagleeye.agents.adoption import declared_ranks
from eagleeye.agents.membership import AgentLost, AgentState
from eagleeye.agents.resume import nodes_of, restore_agents
from eagleeye.errors import EagleEyeError, StoreError
from eagleeye.store import RunStore
from ft_runtime.errors import LaunchError
from ft_runtime.launcher import RankExit
from ft_runtime.replica.state import ReplicaState
from ft_runtime.replica.supervisor import _Rank
from ft_runtime.storehost import DetachedStore
from ft_runtime.types import Phase

if TYPE_CHECKING:
    from eagleeye.agents.replicas import ReplicaCoordinator

log = logging.getLogger(__name__)
#: The ``meta`` key of the journal.
KEY = "replica_state"
#: The journal's own format version.
VERSION = 1


def state_of(job: ReplicaCoordinator) -> dict[str, Any]:
    """What a restarted controller needs of ``job`` (JSON)."""
    sup, launcher, store = job.supervisor, job.launcher, job.quorum_store
    assert sup is not None
    assert store is not None
    return {
        "version": VERSION,
        "phase": job.phase.value,
        "store": {"address": store.address, "pid": store.pid},
        "master_addr": sup.launch.master_addr,
        "nodes": nodes_of(job._by_node),
        "fenced": job.members.fence_stops(),
        "evicted": dict(job._evicted),
        "on_lost_hosts": sorted(job._on_lost_hosts),
        "supervisor": {
            "attempt": sup.attempt,
            "restarts": sup.restarts,
            "job_restarts": sup.job_restarts,
            "phase": sup.phase.value,
            "no_restart": sup.no_restart,
            "replicas": {
                str(r): [s.incarnation, s.restarts, s.phase.value, s.dropped_at]
                for r, s in sup.replicas.items()
            },
            "evicted_nodes": sorted(sup.evicted_nodes),
            "lost": sorted(sup._lost),
            "done_keys": sorted(sup._done_keys),
            "ranks": {
                str(rank): [
                    r.spec.node,
                    r.incarnation,
                    r.pid,
                    str(r.log_path),
                    r.expected_stop,
                    r.exit_collected,
                    r.culprit,
                    r.clean,
                ]
                for rank, r in sup._ranks.items()
            },
        },
        "launcher": {
            "agents": {str(n): a for n, a in launcher.agents.items()},
            "where": {str(r): a for r, a in launcher._where.items()},
            "generation": {str(r): g for r, g in launcher._generation.items()},
            "pids": {str(r): p for r, p in launcher._pids.items()},
            "ended": sorted(launcher._ended),
            "lost": sorted(launcher._lost),
            "exits": [[e.rank, e.generation, e.code, e.time] for e in launcher._exits],
        },
    }


def save(store: RunStore, job: ReplicaCoordinator, last: dict[str, Any] | None) -> dict[str, Any]:
    """The journal: ``job``'s state, committed unless it is ``last`` (written already).
    Returns what the run store now holds. A store that fails is logged; the job goes on
    (a controller restarted later may not)."""
    state = state_of(job)
    if state == last:
        return state
    store.set_meta(KEY, state)
    try:
        store.flush()
    except StoreError as exc:
        log.error(
            "the replica job's state is not in the run store (%s): a controller restarted "
            "now could not go on with this job",
            exc,
        )
    return state


def restore(job: ReplicaCoordinator, state: Mapping[str, Any]) -> None:
    """Puts the journal's state back into a new ``job`` (before ``run``).

    Raises:
        EagleEyeError: the quorum's store process does not answer at its address.
    """
    where = state["store"]
    try:
        job.quorum_store = DetachedStore.attach(
            str(where["address"]), int(where["pid"]), job.secret
        )
    except LaunchError as exc:
        raise EagleEyeError(
            f"the replica job cannot go on: {exc}; the quorum's store ran on the first "
            "controller's host (lost, or this controller runs elsewhere); give another "
            "--run-id to start the job again from its checkpoints"
        ) from None
    nodes = restore_agents(job, state)
    job._on_lost_hosts = {int(r) for r in state.get("on_lost_hosts", ())}
    _restore_launcher(job, state["launcher"])
    sup = job.supervise(str(state["master_addr"]))
    _restore_supervisor(job, state["supervisor"])
    sup.quorum.start()  # on the same store, at the newest epoch of its membership log
    job.phase = Phase.RUNNING
    job.restored = True
    job.adopting = {agent.agent for agent in nodes.values()}
    sup._emit_membership(sup.quorum.current, resumed=True, reason="the controller restarted")
    job._record(sup._take_events())
    job._event(
        "job",
        Phase.RUNNING,
        reason="the controller restarted; adopting the agents' ranks",
        agents={str(n): a.agent for n, a in nodes.items()},
        epoch=sup.quorum.current.epoch,
    )


def _restore_launcher(job: ReplicaCoordinator, state: Mapping[str, Any]) -> None:
    launcher = job.launcher
    launcher.agents = {int(n): str(a) for n, a in state["agents"].items()}
    launcher._where = {int(r): str(a) for r, a in state["where"].items()}
    launcher._generation = {int(r): int(g) for r, g in state["generation"].items()}
    launcher._pids = {int(r): int(p) for r, p in state["pids"].items()}
    launcher._ended = {int(r) for r in state["ended"]}
    launcher._lost = {str(a) for a in state["lost"]}
    launcher._exits = [RankExit(int(r), int(g), int(c), float(t)) for r, g, c, t in state["exits"]]


def _restore_supervisor(job: ReplicaCoordinator, state: Mapping[str, Any]) -> None:
    sup = job.supervisor
    assert sup is not None
    sup.attempt = int(state["attempt"])
    sup.restarts = int(state["restarts"])
    sup.job_restarts = int(state["job_restarts"])
    sup.phase = Phase(state["phase"])
    sup.no_restart = state.get("no_restart")
    sup.replicas = {
        int(r): ReplicaState(int(i), int(n), Phase(p), None if at is None else float(at))
        for r, (i, n, p, at) in state["replicas"].items()
    }
    sup.evicted_nodes = {str(n) for n in state["evicted_nodes"]}
    sup._lost = {int(r) for r in state["lost"]}
    sup._done_keys = {str(k) for k in state["done_keys"]}
    layout = job.layout
    ranks = {}
    for rank, (node, inc, pid, path, expected, collected, culprit, clean) in state["ranks"].items():
        spec = layout.rank(int(rank))
        if spec.node != node:  # moved to a spare node (``_placed``)
            spec = dataclasses.replace(spec, node=str(node))
        ranks[int(rank)] = _Rank(spec, int(inc), int(pid), Path(path), expected, collected)
        ranks[int(rank)].culprit, ranks[int(rank)].clean = bool(culprit), bool(clean)
    sup._ranks = ranks


def adopt(job: ReplicaCoordinator, held: AgentState, agent: AgentState) -> None:
    """``agent`` said ``hello`` again for the node rank ``held`` (of the same name)
    holds, to a controller restarted from its run store."""
    job.adopting.discard(agent.agent)
    node = held.node_rank
    if held.session and agent.session != held.session:
        why = (
            f"{agent.agent} came back as a new process (not the session this job admitted); "
            "the ranks of its node cannot be adopted"
        )
        log.warning("not adopted: %s", why)
        job._event(f"agent:{agent.agent}", Phase.EXITED, host=agent.host, reason=why)
        job._host_lost(AgentLost(agent.agent, agent.host, node, held.last_seen, job.clock(), 0))
        return
    job._by_node[node] = agent
    job.on_joined(agent)
    launcher = job.launcher
    resume = agent.info.get("resume")
    declared = {
        r["rank"]: r
        for r in declared_ranks(resume.get("ranks") if isinstance(resume, Mapping) else None)
        if isinstance(r["attempt"], int)  # the incarnation each rank runs under
    }
    adopted: dict[str, int] = {}
    ended: dict[str, int] = {}
    unknown: list[int] = []
    for rank in launcher.ranks_on(agent.agent):
        if not launcher.running(rank):
            continue
        generation = launcher._generation[rank]
        row = declared.get(rank)
        if row is None or row["attempt"] != generation:
            unknown.append(rank)  # not running as the journal says: ended, its replica restarts
            launcher.exited(agent.agent, rank, -signal.SIGKILL, generation)
        elif row["code"] is None:
            launcher.launched(agent.agent, rank, row["pid"], generation)
            adopted[str(rank)] = row["pid"]
        else:
            launcher.exited(agent.agent, rank, row["code"], generation)
            ended[str(rank)] = row["code"]
    strays = sorted(
        r for r, row in declared.items() if row["code"] is None and str(r) not in adopted
    )
    if strays:  # running under an incarnation this controller does not know
        job.members.send(agent.agent, "stop_ranks", {"ranks": strays, "grace_s": 0.0})
    job._event(
        f"agent:{agent.agent}",
        Phase.RUNNING,
        host=agent.host,
        node=node,
        adopted=True,
        pids=adopted,
        ended_meanwhile=ended,
        not_running=unknown,
        stopped=strays,
    )


__all__ = ["KEY", "adopt", "restore", "save", "state_of"]
