"""A host whose agent leaves on a signal (a scheduler's preemption, a node drain), with the
real Membership and JobCoordinator over real sockets and a real run store, the hosts
driven by hand (``tests.eagleeye.test_spares``). With a spare waiting the leaving host is
drained: every host is asked for a checkpoint first when its grace period allows, the
leaving agent is told it was drained (no rejoin, no eviction), the spare takes its node
rank and every host restarts as the next attempt; the store has an ``evict`` action with
the reason, and no finding; a dry run (no ``--remediate``) drains too, as a lost host is
replaced. The drained host may come back as a spare without
``readmit``. With no spare, or the restart budget spent, the job stops as before; a spare
that leaves is dropped and the job goes on."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from eagleeye.stopping import EVENT_LISTENING
from eagleeye.store import RunReader
from ft_runtime.types import LifecycleEvent, Phase
from remediation.remediator import Remediator
from tests.eagleeye.test_spares import Host, Job, pump, restarted, two_hosts_and_a_spare


def event(name: str, rank: int, value: float = 0.0, **labels: str) -> dict[str, Any]:
    return {
        "name": name,
        "value": value,
        "time": time.time(),
        "labels": {"rank": str(rank), **labels},
    }


def leave(host: Host, grace_s: float = 0.0) -> None:
    host.send("leaving", {"cause": "SIGTERM", "grace_s": grace_s})


def finish(job: Any, hosts: list[Host], attempt: int, by_rank: dict[int, Host]) -> None:
    for rank, host in by_rank.items():
        host.send("exit", {"rank": rank, "code": 0, "attempt": attempt})
    pump(hosts, lambda: job.result)


def test_a_leaving_host_is_drained_to_the_spare_and_may_come_back_as_one(
    tmp_path: Path,
) -> None:
    with two_hosts_and_a_spare(tmp_path) as (job, nodes, spare, hosts):
        pump(hosts, lambda: all(h.kinds("launch") for h in nodes))
        leave(nodes[1])
        pump(hosts, lambda: restarted(spare, 1) and restarted(nodes[0], 1))
        took, kept = restarted(spare, 1), restarted(nodes[0], 1)
        assert took is not None
        assert kept is not None
        assert (took["node_rank"], kept["node_rank"]) == (1, 0)
        assert nodes[1].kinds("restart") == []  # nothing restarted onto the leaving host
        assert [h.kinds("checkpoint") for h in nodes] == [[], []]  # no grace: none asked
        pump(hosts, lambda: nodes[1].kinds("stop"))
        stop = nodes[1].kinds("stop")[0]
        assert "host h1 left on SIGTERM" in stop["drained"]
        assert set(stop) == {"drained"}  # no rejoin, no eviction: it left
        # the same host joins again later as a spare, without readmit: admitted
        back = Host(job.members.address, "h1-spare", -1, spare=True, host="h1")
        hosts.append(back)
        pump(hosts, lambda: back.kinds("welcome") and _spare_events(job, "h1-spare"))
        assert back.kinds("stop") == []
        finish(job, hosts, 1, {0: nodes[0], 1: spare})
        assert job.result == [Phase.SUCCEEDED]
    with RunReader(job.run_dir) as run:
        actions = run.actions()
        findings = run.findings()
        events = run.events()
    assert len(findings) == 0  # a signal is no finding
    assert list(zip(actions["kind"], actions["status"], strict=True)) == [("evict", "done")]
    assert actions["target"][0] == "node:node1"
    assert "host h1 left on SIGTERM" in actions["reason"][0]
    assert "node rank 1 moved to the spare hs" in actions["detail"][0]
    assert "attempt 1" in actions["detail"][0]
    mine = events[events["subject"] == "agent:h1"]
    assert "evicted" not in set(mine["phase"])  # it left; it is no suspect
    recovering = events[(events["subject"] == "job") & (events["phase"] == "recovering")]
    assert len(recovering) == 1
    assert "h1 left on SIGTERM: node rank 1 moved to the spare hs" in str(
        recovering["detail"].iloc[0]["reason"]
    )


def test_with_a_grace_period_every_host_checkpoints_before_the_drain(tmp_path: Path) -> None:
    with two_hosts_and_a_spare(tmp_path) as (job, nodes, spare, hosts):
        job.coordinator.grace_s = 30.0  # `eagleeye controller --grace-period 30`
        pump(hosts, lambda: all(h.kinds("launch") for h in nodes))
        for rank, host in enumerate(nodes):
            host.send("events", {"samples": [event(EVENT_LISTENING, rank)]})
        pump(hosts, lambda: len(_listening(job)) == 2)
        leave(nodes[1], grace_s=30.0)
        pump(hosts, lambda: all(h.kinds("checkpoint") for h in nodes))
        assert restarted(spare, 1) is None  # not before the checkpoint
        step = nodes[0].kinds("checkpoint")[0]["step"]
        assert nodes[1].kinds("checkpoint")[0]["step"] == step  # one step for every host
        step = 7 if step is None else step  # no step telemetry here: the next step
        for rank, host in enumerate(nodes):  # each rank saves, then leaves its loop
            saved = event("event.checkpoint", rank, float(step), tier="disk", path=f"/c/{rank}")
            host.send("events", {"samples": [saved]})
            host.send("exit", {"rank": rank, "code": 0, "attempt": 0})  # no success: a drain
        pump(hosts, lambda: restarted(spare, 1) and restarted(nodes[0], 1))
        pump(hosts, lambda: nodes[1].kinds("stop"))
        assert "drained" in nodes[1].kinds("stop")[0]
        assert job.result == []  # the ranks' exits during the drain ended nothing
        finish(job, hosts, 1, {0: nodes[0], 1: spare})
        assert job.result == [Phase.SUCCEEDED]
    with RunReader(job.run_dir) as run:
        saved = run.query("SELECT rank, step FROM checkpoints ORDER BY rank")
        actions = run.actions()
    assert list(saved["rank"]) == [0, 1]
    assert set(saved["step"]) == {step}
    assert list(actions["kind"]) == ["evict"]


def test_with_no_spare_a_leaving_host_stops_the_job(tmp_path: Path) -> None:
    with two_hosts_and_a_spare(tmp_path) as (job, nodes, spare, hosts):
        pump(hosts, lambda: all(h.kinds("launch") for h in nodes))
        leave(spare)  # a spare that leaves is dropped: the job goes on
        pump(hosts, lambda: spare.kinds("stop"))
        assert "drained" in spare.kinds("stop")[0]
        assert job.result == []
        leave(nodes[1])  # no spare any more: the job stops, as before
        pump(hosts, lambda: job.result)
        assert job.result == [Phase.FAILED]
        pump(hosts, lambda: nodes[0].kinds("stop"))
        assert [h.kinds("restart") for h in hosts] == [[], [], []]
    with RunReader(job.run_dir) as run:
        end = run.query("SELECT detail FROM events WHERE subject = 'job' AND phase = 'failed'")
        actions = run.actions()
    assert "stopped by SIGTERM to the agent h1" in end["detail"][0]
    assert len(actions) == 0


def test_with_the_budget_spent_a_leaving_host_stops_the_job(tmp_path: Path) -> None:
    with two_hosts_and_a_spare(tmp_path, max_restarts=0) as (job, nodes, spare, hosts):
        pump(hosts, lambda: all(h.kinds("launch") for h in nodes))
        leave(nodes[1])
        pump(hosts, lambda: job.result)
        assert job.result == [Phase.FAILED]
        pump(hosts, lambda: spare.kinds("stop"))  # the job's end, to the spare too
        assert spare.kinds("restart") == []
        assert "drained" not in nodes[1].kinds("stop")[0]


def _spare_events(job: Any, agent: str) -> list[LifecycleEvent]:
    return [
        e
        for e in job.events
        if e.subject == f"agent:{agent}" and e.phase is Phase.RUNNING and e.detail.get("spare")
    ]


def _listening(job: Any) -> list[LifecycleEvent]:
    return [e for e in job.events if e.detail.get("listening")]


def test_a_dry_run_drains_too_as_a_lost_host_is_replaced(tmp_path: Path) -> None:
    # without --remediate the policy's actions are only decided; a host going away is no
    # policy decision: its node rank goes to the spare all the same
    job = Job(tmp_path)
    job.coordinator.remediator = Remediator(job.coordinator.policy, job.coordinator, True)
    nodes = [Host(job.members.address, f"h{n}", n) for n in range(2)]
    spare = Host(job.members.address, "hs", -1, spare=True)
    hosts = [*nodes, spare]
    job.start()
    try:
        pump(hosts, lambda: all(h.kinds("launch") for h in nodes))
        leave(nodes[1])
        pump(hosts, lambda: restarted(spare, 1) and restarted(nodes[0], 1))
        finish(job, hosts, 1, {0: nodes[0], 1: spare})
        assert job.result == [Phase.SUCCEEDED]
    finally:
        job.close()
        for host in hosts:
            host.close()
    with RunReader(job.run_dir) as run:
        actions = run.actions()
    assert list(zip(actions["kind"], actions["dry_run"], strict=True)) == [("evict", 0)]
