"""A job across hosts survives its controller: the state it needs, in the run store.

The coordinator's journal (``save``) writes what a restarted controller needs to go on
into the run's ``meta`` table (key ``cluster_state``, JSON; no schema change), committed
before the agents are told anything it decides: the current attempt and its launch
(``MASTER_ADDR``/``MASTER_PORT``, the holders' ring), the agent of every node rank (name,
host, the session of its hello, what it declared), the agents fenced and what they are
told, the attempts that failed, the ranks that succeeded, the exits handled, the
actions executed and the ranks whose loops listen for a checkpoint request. Everything
else (findings, actions, events, samples, checkpoints) is in the store's tables already.

``eagleeye controller`` started again with the same ``--runs-dir`` and ``--run-id``
finds the run unfinished (``load``) and ``restore`` puts that state back: the job is
running at its attempt, the restart budget used is the attempt's number, the agents it
had admitted are expected back (a fresh heartbeat window each), and their ranks are
adopted as they say hello again (``eagleeye.agents.adoption``). The detectors, the
hosts' reduced telemetry and the remediation policy's cooldowns start afresh.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagleeye.agents.membership import AgentState
from eagleeye.errors import EagleEyeError, StoreError
from eagleeye.store import DB_NAME, RunStore
from ft_runtime.types import Phase

if TYPE_CHECKING:
    from eagleeye.agents.coordinator import JobCoordinator
    from eagleeye.agents.replicas import ReplicaCoordinator

log = logging.getLogger(__name__)
#: The ``meta`` key of the journal.
KEY = "cluster_state"
#: The journal's own format version.
VERSION = 1
#: The configuration a restarted controller must be given again, as it was.
SAME = ("nnodes", "nproc_per_node", "recovery", "replicas", "snapshots")
#: The ``meta`` key of a replica job's journal (``eagleeye.agents.replicaresume``).
REPLICA_KEY = "replica_state"


def state_of(job: JobCoordinator) -> dict[str, Any]:
    """What a restarted controller needs of ``job`` (JSON)."""
    return {
        "version": VERSION,
        "attempt": job.attempt,
        "phase": job.phase.value,
        "launch": dict(job.launch_body),
        "ring": job._ring,
        "nodes": nodes_of(job._by_node),
        "fenced": job.members.fence_stops(),
        "evicted": dict(job._evicted),
        "failed_attempts": sorted(job._failed_attempts),
        "succeeded": sorted(job._succeeded),
        "exits": sorted([a, r] for a, r in job._exits_seen if a == job.attempt),
        "done_keys": sorted(job._done_keys),
        "listening": sorted(job._listening),
    }


def nodes_of(by_node: Mapping[int, AgentState]) -> dict[str, dict[str, Any]]:
    """The agent of every node rank, as a journal keeps it (what its hello declared but
    the ranks it runs, which a restarted controller hears again)."""
    return {
        str(node): {
            "agent": agent.agent,
            "host": agent.host,
            "session": agent.session,
            "info": {k: v for k, v in agent.info.items() if k != "resume"},
        }
        for node, agent in by_node.items()
    }


def save(store: RunStore, job: JobCoordinator) -> None:
    """The journal: ``job``'s state, committed before the caller goes on. A store that
    fails is logged, and the job goes on (a controller restarted later may not)."""
    store.set_meta(KEY, state_of(job))
    try:
        store.flush()
    except StoreError as exc:
        log.error(
            "the job's state is not in the run store (%s): a controller restarted "
            "now could not go on with this job",
            exc,
        )


def load(run_dir: Path, config: Mapping[str, Any]) -> dict[str, Any] | None:
    """The journal of the unfinished run in ``run_dir``, for a controller started again
    with ``config`` (a job's, or with ``--recovery replica`` a replica job's:
    ``eagleeye.agents.replicaresume``); None when the run never launched (it starts over
    in its store).

    Raises:
        EagleEyeError: the run ended, is no job across hosts, or ``config`` differs from
            the run's in what a restart cannot change.
    """
    try:
        conn = sqlite3.connect(f"file:{run_dir / DB_NAME}?mode=ro", uri=True)
        try:
            meta = {k: json.loads(v) for k, v in conn.execute("SELECT key, value FROM meta")}
        finally:
            conn.close()
    except (sqlite3.Error, ValueError) as exc:
        raise EagleEyeError(f"cannot read the run store in {run_dir}: {exc}") from None
    if "result" in meta:
        how = "succeeded" if meta["result"].get("succeeded") else "failed"
        raise EagleEyeError(
            f"run {run_dir.name} ended ({how}); give another --run-id to start a new job"
        )
    known = meta.get("config") or {}
    if known.get("recovery") not in ("job", "replica"):
        raise EagleEyeError(
            f"run {run_dir.name} is not a job of `eagleeye controller`; give another --run-id"
        )
    changed = [k for k in SAME if k in known and known[k] != config.get(k)]
    if changed:
        was = ", ".join(f"{k}={known[k]!r}" for k in changed)
        raise EagleEyeError(
            f"run {run_dir.name} was started with {was}; restart its controller with the "
            "same flags, or give another --run-id"
        )
    state = meta.get(REPLICA_KEY if known["recovery"] == "replica" else KEY)
    if state is None:
        return None
    if state.get("version") != VERSION or state.get("phase") != Phase.RUNNING.value:
        raise EagleEyeError(
            f"run {run_dir.name} ended ({state.get('phase')}); give another --run-id"
        )
    return dict(state)


def restore_agents(
    job: JobCoordinator | ReplicaCoordinator, state: Mapping[str, Any]
) -> dict[int, AgentState]:
    """Puts a journal's agents back into ``job``: each node rank's agent (expected to say
    hello again), the fenced ones, the evicted hosts. Returns the agents by node rank."""
    nodes = {
        int(node): AgentState(
            agent=str(held["agent"]),
            host=str(held["host"]),
            node_rank=int(node),
            identity=b"",
            admitted_at=0.0,
            last_seen=0.0,
            info=dict(held.get("info") or {}),
            session=str(held.get("session", "")),
        )
        for node, held in state["nodes"].items()
    }
    job._by_node = dict(nodes)
    job.members.restore(list(nodes.values()), state.get("fenced") or {})
    for node, agent in nodes.items():
        job.members.assign(agent.agent, node)
        job.on_joined(agent)
    job._evicted = {str(h): str(why) for h, why in (state.get("evicted") or {}).items()}
    return nodes


def restore(job: JobCoordinator, state: Mapping[str, Any]) -> None:
    """Puts the journal's state back into a new ``job`` (before ``run``)."""
    job.attempt = int(state["attempt"])
    job.phase = Phase.RUNNING
    job.launch_body = dict(state["launch"])
    job._ring = state.get("ring")
    nodes = restore_agents(job, state)
    job._failed_attempts = set(state.get("failed_attempts", ()))
    job._succeeded = set(state.get("succeeded", ()))
    job._exits_seen = {(int(a), int(r)) for a, r in state.get("exits", ())}
    job._done_keys = set(state.get("done_keys", ()))
    job._listening = set(state.get("listening", ()))
    job.restored = True
    job._event(
        "job",
        Phase.RUNNING,
        reason="the controller restarted; adopting the agents' ranks",
        agents={str(n): a.agent for n, a in nodes.items()},
    )


__all__ = ["KEY", "load", "restore", "save", "state_of"]
