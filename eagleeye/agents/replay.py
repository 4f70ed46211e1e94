"""A trace replayed the way `eagleeye controller` with agents would judge it.

Across hosts the ranks' step telemetry never reaches the controller whole: each node's
agent summarises every step of its ranks (``summarise``, sealed and opened as the real
message), judges its ranks' full series itself (``HostJudge``) and reports the findings,
which the controller checks (``host_findings``); the controller reduces the summaries
(``SummaryIntake``), judges the outliers' rows, the job's frame and the hosts' medians
(``ReducedJudge`` with ``HostPeers``) and keeps one finding per fault (``once``). This
module runs that path over a trace, in one process, step by step.

The evidence the agents forward as it is (a rank's exit, the hosts' GPU samples, the
ranks' progress when a host stalls) is judged by the same rules as in a replay of one
machine (``replay_rules``: the exit, the GPU rules, the collective-hang wait-for graph
standing in for the progress detector). The trace's nodes are the hosts: node k is the
k-th node in the order of its lowest rank, and every node must hold the same number of
ranks, numbered in a block (a ``JobLayout``).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from detectors.config import DetectorsConfig
from detectors.errors import DetectorError
from detectors.eval.runner import Emitted
from detectors.eval.trace import Trace
from detectors.fusion import FusionPolicy
from detectors.progress import HangLimits
from detectors.types import Finding
from eagleeye.agents.hostjudge import HostJudge
from eagleeye.agents.intake import SummaryIntake
from eagleeye.agents.judging import ReducedJudge, host_findings
from eagleeye.agents.ranktelemetry import HostSteps
from eagleeye.agents.summary import encode_summary, parse_summary
from eagleeye.detection import replay_rules
from ft_runtime.layout import JobLayout

_KEY = b"replay" * 6  # any key: the summaries are sealed and opened as on the wire
_SESSION = "0000000000000000"


def layout_of(trace: Trace) -> tuple[JobLayout, list[str]]:
    """The job layout of the trace's hosts and the trace's name of each node rank.

    Raises:
        DetectorError: the nodes hold different numbers of ranks, or not in blocks.
    """
    order = np.argsort(trace.ranks, kind="stable")
    ranks, nodes = trace.ranks[order].tolist(), trace.nodes[order].tolist()
    names = list(dict.fromkeys(nodes))
    per_node = len(ranks) // max(len(names), 1)
    blocks = [nodes[k * per_node : (k + 1) * per_node] for k in range(len(names))]
    if (
        ranks != list(range(len(ranks)))
        or per_node * len(names) != len(ranks)
        or any(block != [name] * per_node for block, name in zip(blocks, names, strict=True))
    ):
        raise DetectorError(
            "replaying across hosts needs ranks 0..N-1 in blocks of one size per node "
            f"(this trace: {len(ranks)} ranks on {len(names)} nodes); score it without "
            "--hosts"
        )
    return JobLayout(nnodes=len(names), nproc_per_node=per_node), names


def run_trace_across_hosts(trace: Trace, limits: HangLimits | None = None) -> list[Emitted]:
    """Every observation of the trace through the agents' and the controller's path, in
    time order; the findings as the controller would answer them."""
    layout, names = layout_of(trace)
    rules = DetectorsConfig(replay_rules(limits), FusionPolicy()).build()
    now = [0.0]
    intake = SummaryIntake(layout, clock=lambda: now[0])
    judge = ReducedJudge(None, layout)
    agents = [HostSteps(layout.nproc_per_node, judge=HostJudge()) for _ in names]
    per_node = layout.nproc_per_node
    launches = np.zeros(layout.world_size, dtype=int)  # each rank's, the first one included
    attempt = 0  # the job's: a restart relaunches every rank, which reports ``launched``
    out: list[Emitted] = []
    step, seq = 0, 0
    for batch in trace.batches():
        step, now[0] = batch.step, batch.time
        for finding in rules.process_step(batch):
            judge.note(finding)
            out.append(Emitted(finding, step, batch.time))
        for frame in batch.frames(reported_only=True):
            rank = frame.subject.rank or 0
            launches[rank] += "launched" in frame.values
            if launches[rank] - 1 > attempt:  # a new attempt: the controller starts afresh
                attempt = int(launches[rank]) - 1
                judge.reset()
            agents[rank // per_node].add(frame, max(int(launches[rank]) - 1, 0), batch.time)
        found: list[Finding] = []
        for node, agent in enumerate(agents):
            for summary in agent.ready(batch.time):
                seq += 1
                sealed = encode_summary(summary, _KEY, _SESSION, seq)
                intake.take(node, parse_summary(_KEY, *sealed), len(sealed[0]), batch.time)
            found += _checked(agent, node, layout, batch.time, judge, attempt)
        found += judge.judge(intake.frames(hosts=layout.nnodes), now[0], intake.take_medians())
        out += [Emitted(_named(f, names), step, batch.time) for f in found]
    out += [Emitted(f, step, now[0]) for f in rules.flush()]
    last: list[Finding] = []
    for node, agent in enumerate(agents):
        if agent.judge is not None:
            agent.findings += [(agent.judge.attempt, f) for f in agent.judge.flush()]
        last += _checked(agent, node, layout, now[0], judge, attempt)
    if judge.hosts is not None:
        last += judge.once(judge.hosts.flush())
    return out + [Emitted(_named(f, names), step, now[0]) for f in last]


def _checked(
    agent: HostSteps, node: int, layout: JobLayout, now: float, judge: ReducedJudge, attempt: int
) -> list[Finding]:
    """A host's findings as the controller takes them: over the wire's JSON, checked and
    placed (``host_findings``), of the job's attempt, one per fault."""
    reported, agent.findings = agent.findings, []
    rows = [f.to_json() for a, f in reported if a == attempt]
    if not rows:
        return []
    _, placed = host_findings(
        {"attempt": attempt, "findings": rows}, f"replay-{node}", node, layout, now
    )
    return judge.once(placed)


def _named(finding: Finding, names: list[str]) -> Finding:
    """The finding with the trace's name of its node (the layout's is ``node<k>``): the
    path across hosts places every finding by the layout."""
    node = finding.subject.node
    if node is None or not node.startswith("node") or not node[4:].isdigit():
        return finding
    k = int(node[4:])
    if k >= len(names):
        return finding
    return replace(finding, subject=replace(finding.subject, node=names[k]))


__all__ = ["layout_of", "run_trace_across_hosts"]
