"""What a run did, read back from its store: the tables of the terminal summary.

Every figure here comes from the run store, so the summary shows what was recorded, not
what the controller believes happened. Every finding names its host (``RunHosts``: the
hostname of its rank's or node's host, ``job`` for one on the whole job).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pandas as pd

from eagleeye.goodput import effective_training
from eagleeye.runhosts import RunHosts
from eagleeye.store import RunReader


@dataclass(frozen=True, slots=True)
class FaultOutcome:
    """One injected fault against what Eagle Eye did about it."""

    spec: str
    injected_at: float
    step: int | None
    finding: str | None
    detection_delay_s: float | None
    action: str | None
    outcome: str | None
    recovered_after_s: float | None


@dataclass(frozen=True, slots=True)
class RunSummary:
    run_dir: str
    succeeded: bool
    attempts: int
    last_step: int
    wall_s: float
    steps_per_s: float
    tokens_per_s: float
    final_loss: float
    ettr: float
    lost_s: float
    faults: list[FaultOutcome]
    actions: pd.DataFrame
    findings: pd.DataFrame
    hosts: RunHosts

    def host_of(self, finding_id: Any) -> str:
        """The host of the finding with this id (an action's ``finding_id``); "-" for none."""
        if finding_id is None or pd.isna(finding_id):
            return "-"
        rows = self.findings[self.findings["id"] == finding_id].to_dict("records")
        return self.hosts.of_finding(rows[0]) if rows else "-"


def summarize(run_dir: str) -> RunSummary:
    reader = RunReader(run_dir)
    try:
        meta = reader.meta()
        result = meta.get("result", {})
        steps = reader.samples(names=["step_time", "tokens", "loss", "replicas"])
        findings = reader.findings()
        actions = reader.actions()
        faults = reader.faults()
        hosts = RunHosts.read(reader)
    finally:
        reader.close()
    wall = float(result.get("ended", 0.0)) - float(result.get("started", 0.0))
    last_step = int(steps["step"].max()) if not steps.empty else -1
    replicas = int(meta.get("config", {}).get("replicas", 1))
    ettr, lost = effective_training(steps, replicas)
    steps_per_s, tokens_per_s = throughput(steps, wall)
    return RunSummary(
        run_dir=run_dir,
        succeeded=bool(result.get("succeeded", False)),
        attempts=int(result.get("attempts", 1)),
        last_step=last_step,
        wall_s=wall,
        steps_per_s=steps_per_s,
        tokens_per_s=tokens_per_s,
        final_loss=final_loss(steps),
        ettr=ettr,
        lost_s=lost,
        faults=[
            _match(fault, findings, actions, steps, hosts) for fault in faults.to_dict("records")
        ],
        actions=actions,
        findings=findings,
        hosts=hosts,
    )


def throughput(steps: pd.DataFrame, wall_s: float) -> tuple[float, float]:
    """Steps and tokens per second over ``wall_s``: each (attempt, step) of ``step_time``
    counts once, and every ``tokens`` sample is summed. NaN when no time has passed."""
    if wall_s <= 0:
        return math.nan, math.nan
    step_times = steps[steps["name"] == "step_time"]
    distinct_steps = step_times.drop_duplicates(["attempt", "step"]).shape[0]
    tokens = float(steps.loc[steps["name"] == "tokens", "value"].sum())
    return distinct_steps / wall_s, tokens / wall_s


def final_loss(steps: pd.DataFrame) -> float:
    """Mean over ranks of the loss at the last step (each rank's newest attempt)."""
    loss = steps[steps["name"] == "loss"]
    if loss.empty:
        return math.nan
    last = loss[loss["step"] == loss["step"].max()].sort_values(["attempt", "time"])
    return float(last.drop_duplicates("rank", keep="last")["value"].mean())


def _match(
    fault: dict[Any, Any],
    findings: pd.DataFrame,
    actions: pd.DataFrame,
    steps: pd.DataFrame,
    hosts: RunHosts,
) -> FaultOutcome:
    """The first finding about the fault's rank after it, the action that answered it, and
    when the job was back at the step where the fault struck."""
    injected = float(fault["time"])
    rank = fault["rank"]
    step = None if pd.isna(fault["step"]) else int(fault["step"])
    spec = str(fault["spec"])
    after = findings[(findings["time"] >= injected - 1.0) & (findings["rank"] == rank)]
    if after.empty:
        return FaultOutcome(spec, injected, step, None, None, None, None, None)
    first = after.iloc[0]
    answered = actions[actions["finding_id"] == first["id"]]
    action = outcome = None
    if not answered.empty:  # the first action, as it ended (a command: its final row)
        key = answered.iloc[0]["key"]
        row = answered[answered["key"] == key].iloc[-1]
        action = f"{row['kind']} {row['target']}"
        outcome = f"{row['status']}: {row['detail']}"
    recovered = None
    if step is not None:
        later = steps[
            (steps["name"] == "step_time")
            & (steps["time"] > first["time"])
            & (steps["step"] >= step)
        ]
        if not later.empty:
            recovered = float(later["time"].min()) - injected
    return FaultOutcome(
        spec,
        injected,
        step,
        f"{first['kind']} on {first['scope']} {rank} (host {hosts.of_finding(first.to_dict())})",
        max(0.0, float(first["time"]) - injected),
        action,
        outcome,
        recovered,
    )


@dataclass(frozen=True, slots=True)
class RestoreOutcome:
    """One rank's restore: the step it resumed from, the tier the state came from
    (memory, peer, storage or disk) and how long the restore took (None if not reported)."""

    time: float
    rank: int | None
    attempt: int | None
    step: int
    tier: str
    seconds: float | None


def restores(run_dir: str) -> list[RestoreOutcome]:
    """Every restore the ranks reported, in time order, read from the run store."""
    reader = RunReader(run_dir)
    try:
        table = reader.checkpoints()
    finally:
        reader.close()
    rows = table[table["state"] == "RESTORED"].to_dict("records")
    return [
        RestoreOutcome(
            float(r["time"]),
            _optional_int(r["rank"]),
            _optional_int(r["attempt"]),
            int(r["step"]),
            str(r["tier"]),
            None if pd.isna(r["seconds"]) else float(r["seconds"]),
        )
        for r in rows
    ]


def _optional_int(value: Any) -> int | None:
    return None if value is None or pd.isna(value) else int(value)


#: The finding kinds that answer each injected fault kind, the expected one first.
FAULT_ANSWERS: dict[str, tuple[str, ...]] = {
    "kill": ("process_exit",),
    "stop": ("hang",),
    "slow": ("slow_rank", "slow_node", "slow_replica"),
    "slow_collective": ("slow_rank", "nic_degradation", "slow_node", "slow_replica"),
    "nan": ("nan",),
    "loss_spike": ("loss_spike", "grad_spike"),
}


@dataclass(frozen=True, slots=True)
class FaultFinding:
    """An injected fault, the finding that answered it and the evidence it gave."""

    spec: str
    finding: str | None
    subject: str | None
    detector: str | None
    delay_s: float | None
    delay_steps: int | None
    evidence: dict[str, float]
    host: str | None = None


def fault_findings(run: RunSummary) -> list[FaultFinding]:
    """For each injected fault, the first finding of an answering kind about its rank (or
    the node, replica or job holding it), from a second before the injection on."""
    return [_answer_of(fault, run.findings, run.hosts) for fault in run.faults]


def _answer_of(fault: FaultOutcome, findings: pd.DataFrame, hosts: RunHosts) -> FaultFinding:
    kind, _, rest = fault.spec.partition(":")
    rank = _spec_rank(rest)
    none = FaultFinding(fault.spec, None, None, None, None, None, {})
    if findings.empty or rank is None:
        return none
    answers = FAULT_ANSWERS.get(kind, ())
    candidates = findings[
        findings["kind"].isin(answers) & (findings["time"] >= fault.injected_at - 1.0)
    ]
    about = candidates[candidates.apply(lambda row: _covers(row, rank, findings), axis=1)]
    if about.empty:
        return none
    first = about.iloc[0]
    step = None if pd.isna(first["step"]) or fault.step is None else int(first["step"])
    return FaultFinding(
        fault.spec,
        str(first["kind"]),
        _subject_text(first),
        str(first["detector"]),
        max(0.0, float(first["time"]) - fault.injected_at),
        None if step is None or fault.step is None else max(0, step - fault.step),
        {str(k): float(v) for k, v in dict(first["evidence"]).items()},
        hosts.of_finding(first.to_dict()),
    )


def _spec_rank(rest: str) -> int | None:
    for part in rest.replace("@", ",").split(","):
        key, _, value = part.partition("=")
        if key.strip() == "rank" and value.strip().isdigit():
            return int(value)
    return None


def _covers(row: Any, rank: int, findings: pd.DataFrame) -> bool:
    """Whether a finding's subject holds the rank: itself, the job, or its node/replica."""
    scope = row["scope"]
    if scope == "rank":
        return bool(row["rank"] == rank)
    if scope == "job":
        return True
    mine = findings[findings["rank"] == rank]
    column = "node" if scope == "node" else "replica"
    return bool((mine[column] == row[column]).any())


def _subject_text(row: Any) -> str:
    scope = row["scope"]
    if scope == "job":
        return "job"
    value = row["rank"] if scope == "rank" else row["node" if scope == "node" else "replica"]
    if scope != "node" and not pd.isna(value):
        value = int(value)
    return f"{scope} {value}"


def evidence_text(evidence: dict[str, float], limit: int = 6) -> str:
    """The evidence as ``feature=value`` pairs, the fault's own features first."""
    shown = [f"{k}={v:.4g}" for k, v in list(evidence.items())[:limit]]
    more = len(evidence) - limit
    return ", ".join(shown) + (f" (+{more} more)" if more > 0 else "")


@dataclass(frozen=True, slots=True)
class FindingLine:
    """One finding of a run as the summaries list it: what, on what, on which host, and
    the first action that answered it."""

    kind: str
    subject: str
    host: str
    step: int | None
    severity: str
    action: str | None

    @property
    def text(self) -> str:
        at = "" if self.step is None else f" at step {self.step}"
        answer = f": {self.action}" if self.action else ""
        return f"{self.kind} on {self.subject}{at}, host {self.host} ({self.severity}){answer}"


def finding_lines(run: RunSummary) -> list[FindingLine]:
    """Every finding of the run, in time order, each with its host."""
    return _lines(run.findings, run.actions, run.hosts)


def run_finding_lines(run_dir: str) -> list[FindingLine]:
    """Every finding recorded in a run's store, each with its host (``eagleeye run``)."""
    with RunReader(run_dir) as reader:
        return _lines(reader.findings(), reader.actions(), RunHosts.read(reader))


def _lines(findings: pd.DataFrame, actions: pd.DataFrame, hosts: RunHosts) -> list[FindingLine]:
    lines = []
    for row in findings.to_dict("records"):
        answered = actions[actions["finding_id"] == row["id"]]
        action = None
        if not answered.empty:  # the first action, as it ended
            key = answered.iloc[0]["key"]
            last = answered[answered["key"] == key].iloc[-1]
            dry = " (dry run)" if bool(last["dry_run"]) else ""
            action = f"{last['kind']} {last['target']} {last['status']}{dry}"
        lines.append(
            FindingLine(
                str(row["kind"]),
                _subject_text(row),
                hosts.of_finding(row),
                None if pd.isna(row["step"]) else int(row["step"]),
                str(row["severity"]),
                action,
            )
        )
    return lines
