"""The summaries name the host of every finding, read back from a real run store (SQLite):
a one-machine run's hosts from its meta (as `eagleeye run` records them), a run across
hosts from its events (each rank's launch on its agent's host, a spare taking a node
rank); a rank's host is the one it ran on at the finding's time; a finding on the whole
job is the job's; the demo's tables and `eagleeye run`'s closing lines say it."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from rich.console import Console

from collector.types import Subject
from detectors.types import Finding, Severity
from eagleeye.demo import DemoReport, render
from eagleeye.runhosts import RunHosts
from eagleeye.store import RunReader, RunStore
from eagleeye.summary import finding_lines, run_finding_lines, summarize
from ft_runtime.types import Action, ActionKind, LifecycleEvent, Outcome, OutcomeStatus, Phase


def finding(kind: str, subject: Subject, time: float, step: int | None = None) -> Finding:
    return Finding(kind, subject, 1.0, Severity.CRITICAL, time, step, {"x": 1.0}, "test")


def one_machine_run(tmp_path: Path) -> Path:
    """A store as `eagleeye run` leaves it: 2 nodes × 2 ranks, 2 replicas; its hosts in
    the meta (two names here, so that a wrong node would show)."""
    run = tmp_path / "run"
    run.mkdir()
    store = RunStore(run)
    store.set_meta("config", {"nnodes": 2, "nproc_per_node": 2, "replicas": 2})
    store.set_meta("hosts", {"node0": "gpu-a", "node1": "gpu-b"})
    store.set_meta("result", {"succeeded": True, "attempts": 2, "started": 0.0, "ended": 9.0})
    store.add_fault(0.9, 45, 0, "kill", 3, "kill:rank=3@step=45")
    exit_id = store.add_finding(finding("process_exit", Subject(rank=3), 1.0, 45))
    store.add_finding(finding("xid", Subject(node="node0"), 2.0))
    store.add_finding(finding("slow_replica", Subject(replica=1), 3.0, 50))
    store.add_finding(finding("step_time", Subject(), 4.0, 60))
    store.add_finding(finding("thermal", Subject(node="gpu-z"), 5.0))  # a host's own name
    action = Action(ActionKind.RESTART, "replica:1", "rank 3 exited", "restart:replica:1")
    store.add_outcome(Outcome(action, OutcomeStatus.DONE, "restarted", 1.5), exit_id, False, 1.5)
    store.close()
    return run


def test_a_one_machine_runs_findings_name_their_hosts(tmp_path: Path) -> None:
    run = one_machine_run(tmp_path)
    lines = run_finding_lines(str(run))
    assert [(line.kind, line.subject, line.host) for line in lines] == [
        ("process_exit", "rank 3", "gpu-b"),  # rank 3 is on node1
        ("xid", "node node0", "gpu-a"),
        ("slow_replica", "replica 1", "gpu-b"),  # replica 1's ranks 2 and 3, on node1
        ("step_time", "job", "job"),
        ("thermal", "node gpu-z", "gpu-z"),
    ]
    assert lines[0].text == (
        "process_exit on rank 3 at step 45, host gpu-b (critical): restart replica:1 done"
    )
    assert [line.text for line in finding_lines(summarize(str(run)))] == [
        line.text for line in lines
    ]


def test_the_demo_summary_names_the_host_of_every_finding(tmp_path: Path) -> None:
    run = summarize(str(one_machine_run(tmp_path)))
    console = Console(record=True, width=200)
    render(DemoReport(run, None, (0, False), "policy.toml", ()), console)
    text = console.export_text()
    for row in (
        "│ process_exit │ rank 3     │ gpu-b │ 45   │ critical │ restart replica:1 done │",
        "│ xid          │ node node0 │ gpu-a │ -    │ critical │ -                      │",
        "│ step_time    │ job        │ job   │ 60   │ critical │ -                      │",
    ):
        assert row in text, text
    assert "│ process_exit on rank 3 (host gpu-b) │ restart │" in text  # the actions table
    # the fault's finding: the faults table, and the evidence table's host column
    assert "│ kill:rank=3@step=45 │ process_exit on rank 3 (host gpu-b) │" in text
    assert "│ kill:rank=3@step=45 │ process_exit │ rank 3  │ gpu-b │" in text


def test_across_hosts_a_ranks_host_is_the_one_it_ran_on_at_the_time(tmp_path: Path) -> None:
    """Events as `eagleeye controller` records them: node rank 1 on hb, lost at t=10, its
    node rank moved to the spare hs (rank 1 launched there at t=11)."""
    run = tmp_path / "run"
    run.mkdir()
    store = RunStore(run)
    store.set_meta("config", {"nnodes": 2, "nproc_per_node": 1, "recovery": "job"})
    for t, subject, phase, detail in (
        (0.0, "agent:ha-0", Phase.RUNNING, {"host": "ha", "node": 0}),
        (0.1, "agent:hb-1", Phase.RUNNING, {"host": "hb", "node": 1}),
        (0.2, "agent:hs-spare", Phase.RUNNING, {"host": "hs", "spare": True}),
        (1.0, "rank:0", Phase.LAUNCH, {"agent": "ha-0", "host": "ha", "rank": 0}),
        (1.0, "rank:1", Phase.LAUNCH, {"agent": "hb-1", "host": "hb", "rank": 1}),
        (10.5, "job", Phase.RECOVERING, {"node": 1, "spare": "hs-spare", "host": "hs"}),
        (11.0, "rank:1", Phase.LAUNCH, {"agent": "hs-spare", "host": "hs", "rank": 1}),
    ):
        store.add_event(LifecycleEvent(subject, phase, t, 0 if t < 10 else 1, detail))
    store.add_finding(finding("nan", Subject(rank=1), 5.0, 7))
    store.add_finding(finding("host_lost", Subject(node="node1"), 10.0))
    store.add_finding(finding("slow_rank", Subject(rank=1), 20.0, 30))
    store.add_finding(finding("xid", Subject(node="node1"), 21.0))
    store.add_finding(finding("slow_rank", Subject(rank=0), 22.0, 31))
    store.close()
    assert [(line.kind, line.host) for line in run_finding_lines(str(run))] == [
        ("nan", "hb"),
        ("host_lost", "hb"),  # the host that was lost, not the spare that took its place
        ("slow_rank", "hs"),
        ("xid", "hs"),
        ("slow_rank", "ha"),
    ]
    with RunReader(run) as reader:
        hosts = RunHosts.read(reader)
    assert hosts.of(0.5, 1, None) == "hb"  # before any launch: the node's first host
    assert hosts.of(12.0, None, "node0") == "ha"


def test_a_store_without_hosts_says_so(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    store = RunStore(run)
    store.add_finding(finding("nan", Subject(rank=1), 5.0, 7))
    store.add_finding(finding("step_time", Subject(), 6.0, 8))
    store.close()
    hosts = [line.host for line in run_finding_lines(str(run))]
    assert hosts == ["unknown host", "job"]
    assert isinstance(summarize(str(run)).findings, pd.DataFrame)
