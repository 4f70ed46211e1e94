"""`eagleeye demo`: the product's first impression, end to end on this machine.

Trains the reference GPT on 2 replicas of 2 ranks (two virtual nodes), SIGKILLs one rank
mid-run and lets the controller detect the death. With replica recovery (the default) only
the killed rank's replica stops: the other trains on, the replica restarts, catches up from
its healthy peer and rejoins, and at the end every rank holds bitwise the same parameters.
The summary reports the effective training time ratio (ETTR). A fault-free run with the
same seed is the reference for the final loss.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from eagleeye.console import LiveLog
from eagleeye.errors import EagleEyeError
from eagleeye.launch import JobConfig, run_job
from eagleeye.store import new_run_id
from eagleeye.summary import (
    RestoreOutcome,
    RunSummary,
    evidence_text,
    fault_findings,
    finding_lines,
    restores,
    summarize,
)
from ft_runtime.layout import JobLayout
from remediation.config import builtin_policy

WORKLOAD = "eagleeye.workload.train"


class DemoStopped(Exception):
    """The demo was stopped by a signal (its ranks are gone, the stop is recorded)."""

    def __init__(self, signal: int, run_dir: Path) -> None:
        super().__init__(f"stopped by signal {signal}; store: {run_dir / 'run.db'}")
        self.signal = signal


MIN_STEPS = 10
WORLD_SIZE = 4  # the demo's layout: 2 replicas of 2 ranks on 2 virtual nodes


@dataclass(frozen=True, slots=True)
class DemoConfig:
    steps: int = 160
    kill_rank: int = 3
    kill_step: int | None = None
    reference: bool = True
    runs_dir: str = "runs"
    seed: int = 0
    preset: str = "base"
    batch_size: int = 4
    checkpoint_every: int = 20
    recovery: str = "replica"
    policy: str | None = None
    local_agents: bool = True  # the ranks run through an agent per virtual node

    def __post_init__(self) -> None:
        if self.steps < MIN_STEPS:
            raise EagleEyeError(
                f"--steps {self.steps} is too short for the demo: it needs at least "
                f"{MIN_STEPS} steps (a fault, its detection and a recovery)"
            )
        if not 0 <= self.kill_rank < WORLD_SIZE:
            raise EagleEyeError(
                f"--kill-rank {self.kill_rank} is not a rank of the demo's {WORLD_SIZE} ranks"
            )
        if self.kill_step is not None and not 1 <= self.kill_step < self.steps:
            raise EagleEyeError(
                f"--kill-step {self.kill_step} is not between 1 and the last step "
                f"({self.steps - 1}); the fault must fire while the job trains"
            )

    def policy_file(self) -> str:
        """The policy the demo's actions come from: the one given, else the built-in file
        of its recovery mode."""
        if self.policy is not None:
            return self.policy
        return str(builtin_policy("replica" if self.recovery == "replica" else "default"))

    def snapshots(self) -> bool:
        """Synchronous restarts checkpoint into the snapshot holders and restore from their
        memory; replica recovery restores from a healthy peer instead."""
        return self.recovery == "job"

    def fault(self) -> str:
        step = self.kill_step if self.kill_step is not None else int(self.steps * 0.45)
        return f"kill:rank={self.kill_rank}@step={step}"

    def workload_args(self, params_out: str | None = None) -> list[str]:
        extra = ["--params-out", params_out] if params_out else []
        return [
            *extra,
            "--steps",
            str(self.steps),
            "--seed",
            str(self.seed),
            "--preset",
            self.preset,
            "--batch-size",
            str(self.batch_size),
            "--checkpoint-every",
            str(self.checkpoint_every),
        ]


@dataclass(frozen=True, slots=True)
class DemoReport:
    faulted: RunSummary
    reference: RunSummary | None
    identical_ranks: tuple[int, bool] = (0, False)
    policy_file: str = ""
    restores: tuple[RestoreOutcome, ...] = ()

    @property
    def succeeded(self) -> bool:
        remediated = all(
            f.finding and f.outcome and f.outcome.startswith("done") for f in self.faulted.faults
        )
        return self.faulted.succeeded and bool(self.faulted.faults) and remediated


def run_demo(config: DemoConfig, console: Console | None = None) -> DemoReport:
    console = console or Console(highlight=False)
    layout = JobLayout(nnodes=2, nproc_per_node=2, replicas=2)  # WORLD_SIZE ranks
    run_id = new_run_id("demo")
    console.print(
        Panel.fit(
            f"Training the reference GPT ({config.preset}) for {config.steps} steps on "
            f"{layout.world_size} ranks: {layout.replicas} replicas of {layout.replica_size}, "
            f"2 virtual nodes.\nFault to inject: [bold]{config.fault()}[/bold] (SIGKILL). "
            f"Recovery: {_RECOVERY[config.recovery]}; remediation enabled, actions from "
            f"the policy file {config.policy_file()}.",
            title="Eagle Eye demo",
        )
    )
    params = Path(config.runs_dir) / run_id / "params"
    job = JobConfig(
        script=WORKLOAD,
        module=True,
        script_args=config.workload_args(str(params)),
        layout=layout,
        recovery=config.recovery,
        remediate=True,
        inject=(config.fault(),),
        runs_dir=config.runs_dir,
        run_id=run_id,
        policy=config.policy_file(),
        snapshots=config.snapshots(),
        local_agents=config.local_agents,
    )
    result = run_job(job, on_update=LiveLog(console))
    if result.report.stopped is not None:
        raise DemoStopped(result.report.stopped.signal, result.run_dir)
    faulted = summarize(str(result.run_dir))
    reference = None
    if config.reference:
        with console.status("fault-free reference run with the same seed ..."):
            clean = JobConfig(
                script=WORKLOAD,
                module=True,
                script_args=config.workload_args(),
                layout=layout,
                recovery=config.recovery,
                runs_dir=config.runs_dir,
                run_id=f"{run_id}-reference",
                snapshots=config.snapshots(),
                local_agents=config.local_agents,
            )
            reference = summarize(str(run_job(clean).run_dir))
    report = DemoReport(
        faulted,
        reference,
        params_identical(params),
        config.policy_file(),
        tuple(restores(faulted.run_dir)),
    )
    render(report, console)
    return report


def render(report: DemoReport, console: Console) -> None:
    run = report.faulted
    console.print(_faults_table(run))
    console.print(_evidence_table(run))
    console.print(_findings_table(run))
    console.print(_actions_table(run))
    console.print(_restores_table(report.restores))
    lines = [
        f"Result: [bold]{'succeeded' if run.succeeded else 'FAILED'}[/bold] after "
        f"{run.attempts} attempt(s); last step {run.last_step}; {run.wall_s:.1f} s wall.",
        f"Throughput: {run.steps_per_s:.2f} steps/s, {run.tokens_per_s:,.0f} tokens/s "
        f"(restart included).",
        f"Effective training time ratio (ETTR): [bold]{run.ettr:.1%}[/bold]; "
        f"{run.lost_s:.1f} s of training lost to the fault.",
        _loss_line(report),
        _params_line(report),
        f"Actions came from the policy file [bold]{report.policy_file}[/bold].",
        f"Run store: [bold]{Path(run.run_dir) / 'run.db'}[/bold] "
        f"(read it with eagleeye.store.RunReader).",
    ]
    console.print(Panel("\n".join(lines), title="Summary"))


def _faults_table(run: RunSummary) -> Table:
    table = Table(title="Injected faults, against what Eagle Eye did")
    for column in (
        "fault",
        "detected as",
        "detection delay",
        "action",
        "outcome",
        "back at the fault's step after",
    ):
        table.add_column(column)
    for f in run.faults:
        table.add_row(
            f.spec,
            f.finding or "[red]not detected[/red]",
            _seconds(f.detection_delay_s),
            f.action or "-",
            f.outcome or "-",
            _seconds(f.recovered_after_s),
        )
    return table


def _evidence_table(run: RunSummary) -> Table:
    """Each injected fault's finding: what, where, how soon, and the evidence."""
    table = Table(title="The finding that answered each fault, with its evidence")
    for column in ("fault", "finding", "subject", "host", "delay", "evidence (detector)"):
        table.add_column(column)
    for f in fault_findings(run):
        steps = "" if f.delay_steps is None else f", {f.delay_steps} steps"
        table.add_row(
            f.spec,
            f.finding or "[red]none[/red]",
            f.subject or "-",
            f.host or "-",
            "-" if f.delay_s is None else f"{f.delay_s:.2f} s{steps}",
            f"{evidence_text(f.evidence)} ({f.detector})" if f.finding else "-",
        )
    return table


#: Findings listed in the summary's table at most (the rest: RunReader(...).findings()).
MAX_FINDING_ROWS = 20


def _findings_table(run: RunSummary) -> Table:
    """Every finding of the run: what, on what, on which host, and what answered it."""
    table = Table(title="Findings (each on its host)")
    for column in ("finding", "subject", "host", "step", "severity", "answered by"):
        table.add_column(column)
    lines = finding_lines(run)
    for line in lines[:MAX_FINDING_ROWS]:
        table.add_row(
            line.kind,
            line.subject,
            line.host,
            "-" if line.step is None else str(line.step),
            line.severity,
            line.action or "-",
        )
    if len(lines) > MAX_FINDING_ROWS:
        more = len(lines) - MAX_FINDING_ROWS
        table.add_row(f"+{more} more", "RunReader(...).findings()", "", "", "", "")
    if not lines:
        table.add_row("no finding", "-", "-", "-", "-", "-")
    return table


def _actions_table(run: RunSummary) -> Table:
    table = Table(title="Actions (finding → action → outcome)")
    for column in ("finding", "action", "target", "status", "detail"):
        table.add_column(column)
    for row in run.actions.to_dict("records"):
        table.add_row(
            f"{row['finding_kind']} on {row['finding_scope']} {row['finding_rank']} "
            f"(host {run.host_of(row['finding_id'])})",
            row["kind"],
            row["target"],
            row["status"],
            row["detail"],
        )
    return table


def _restores_table(restores: tuple[RestoreOutcome, ...]) -> Table:
    """Per restore: which rank, from which step, the tier it came from and its time."""
    table = Table(title="Restores (where each restarted rank's state came from)")
    for column in ("rank", "attempt", "resumed at step", "tier", "restore time"):
        table.add_column(column)
    for r in restores:
        table.add_row(
            "-" if r.rank is None else str(r.rank),
            "-" if r.attempt is None else str(r.attempt),
            str(r.step),
            r.tier,
            "-" if r.seconds is None else f"{r.seconds * 1000:.1f} ms",
        )
    if not restores:
        table.add_row("-", "-", "-", "no restore", "-")
    return table


def _loss_line(report: DemoReport) -> str:
    final = report.faulted.final_loss
    if report.reference is None:
        return f"Final loss: {final:.4f} (no reference run)."
    ref = report.reference.final_loss
    delta = abs(final - ref)
    same = "identical" if delta == 0 else f"differs by {delta:.2e}"
    if delta and report.faulted.lost_s > 0:
        same += ": the restarted replica's batches came later, at a scaled learning rate"
    return f"Final loss: {final:.4f}; fault-free reference: {ref:.4f} ({same})."


_RECOVERY = {
    "replica": "only the killed rank's replica restarts and catches up from a healthy peer "
    "while the other trains on",
    "job": "synchronous restart of every rank from the last snapshot, held in memory by "
    "each node's snapshot holder",
}


def params_identical(folder: Path) -> tuple[int, bool]:
    """How many ranks saved final parameters, and whether all are bitwise equal."""
    import torch

    states = [torch.load(p, weights_only=True) for p in sorted(folder.glob("rank-*.pt"))]
    same = all(all(torch.equal(states[0][k], s[k]) for k in states[0]) for s in states[1:])
    return len(states), bool(states) and same


def _params_line(report: DemoReport) -> str:
    count, same = report.identical_ranks
    if count == 0:
        return "Final parameters: not saved."
    verdict = "[bold]bitwise identical[/bold]" if same else "[red]DIFFERENT[/red]"
    return f"Final parameters of the {count} ranks that finished: {verdict}."


def _seconds(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.2f} s"
