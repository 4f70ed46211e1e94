"""Live, one line per event, output of a running job on the terminal."""

from __future__ import annotations

import signal
import time

from rich.console import Console
from rich.markup import escape

from detectors.types import Finding, Severity
from eagleeye.controller import UnknownProgress
from eagleeye.failures import RankFailure
from eagleeye.injector import FaultFired
from eagleeye.launch import RunStarted, UnfiredFaults
from eagleeye.stacks import HangStacks, top_frame
from ft_runtime.types import LifecycleEvent, OutcomeStatus, Phase
from remediation.remediator import Decision

_STYLE = {Severity.CRITICAL: "bold red", Severity.WARN: "yellow", Severity.INFO: "cyan"}
_STATES = {"T": "stopped", "D": "blocked", "R": "running", "S": "sleeping"}


class LiveLog:
    """Prints findings, decisions and job-level lifecycle events as they happen."""

    def __init__(self, console: Console | None = None, started: float | None = None) -> None:
        # soft_wrap: a line stays one line in a log file or a pipe
        self.console = console or Console(stderr=True, highlight=False, soft_wrap=True)
        self.started = time.time() if started is None else started

    def __call__(self, item: object) -> None:
        stamp = f"[dim]{time.time() - self.started:7.2f}s[/dim]"
        if isinstance(item, Finding):
            style = _STYLE[item.severity]
            evidence = ", ".join(f"{k}={v:g}" for k, v in item.evidence.items())
            self.console.print(
                f"{stamp} [{style}]finding[/{style}] {item.kind} on "
                f"{item.subject} at step {item.step} ({evidence})"
            )
        elif isinstance(item, Decision):
            status = item.outcome.status
            style = "green" if status is OutcomeStatus.DONE else "yellow"
            self.console.print(
                f"{stamp} [{style}]action[/{style}] {item.action.kind.value} "
                f"{item.action.target}: {status.value}, {item.outcome.detail}"
            )
        elif isinstance(item, LifecycleEvent):
            self._event(stamp, item)
        elif isinstance(item, HangStacks):
            self._stacks(stamp, item)
        elif isinstance(item, RunStarted):
            self.run_started(item)
        elif isinstance(item, UnfiredFaults):
            self.unfired(item)
        elif isinstance(item, RankFailure):
            self._failure(stamp, item)
        elif isinstance(item, FaultFired):
            where = "" if item.step is None else f" at step {item.step}"
            self.console.print(
                f"{stamp} [magenta]fault[/magenta] {item.spec} fired from outside the rank"
                f"{where} (attempt {item.attempt})"
            )
        elif isinstance(item, UnknownProgress):
            ranks = ", ".join(f"rank {r}" for r in item.ranks)
            self.console.print(
                f"{stamp} {ranks}: no step telemetry {item.after_s:g} s into attempt "
                f"{item.attempt}; progress unknown, not judged hung (a stopped or blocked "
                "process is still found from /proc)"
            )

    def _failure(self, stamp: str, failure: RankFailure) -> None:
        """The first failing rank of an attempt: its traceback and where its log is."""
        how = _signal_name(failure.exit_code)
        self.console.print(
            f"{stamp} [bold red]rank {failure.rank} failed[/bold red] with exit code "
            f"{failure.exit_code}{how} (log: {escape(failure.log_path)})"
        )
        for line in failure.error.splitlines():
            self.console.print(f"          [rank{failure.rank}]: {line}", markup=False)

    def _stacks(self, stamp: str, item: HangStacks) -> None:
        """Where each rank stands: its innermost frame (full stacks: RunReader.stacks())."""
        self.console.print(f"{stamp} stacks of every rank (RunReader(...).stacks()):")
        for stack in item.stacks:
            where = top_frame(stack.text) if stack.method != "none" else stack.text
            host = f" on {stack.host}" if stack.host else ""
            self.console.print(
                f"          rank {stack.rank}{host} [{_STATES.get(stack.state, stack.state)}] "
                f"{stack.method}: {where}",
                markup=False,
            )

    def _event(self, stamp: str, event: LifecycleEvent) -> None:
        if event.subject == "job":
            reason = event.detail.get("reason")
            self.console.print(
                f"{stamp} [bold]job[/bold] {event.phase.value} (attempt {event.attempt})"
                + (f": {reason}" if reason else "")
            )
            if event.phase is Phase.LAUNCH and event.attempt > 0:
                self._resume(stamp, event)
        elif event.phase is Phase.EXITED:
            code = event.detail.get("exit_code")
            note = " (collateral)" if event.detail.get("collateral") else ""
            if code != 0:
                self.console.print(f"{stamp} {event.subject} exited with {code}{note}")

    def _resume(self, stamp: str, event: LifecycleEvent) -> None:
        """What a restarted attempt resumes from, or that nothing is known to resume from."""
        source = event.detail.get("resume_from")
        flags = event.detail.get("resume_args")
        if source:
            self.console.print(f"{stamp} resuming from {source} (EAGLEEYE_RESUME_FROM)")
        if flags:
            self.console.print(f"{stamp} the script is restarted with {escape(flags)}")
        if not source and event.detail.get("launcher") == "torchrun":
            self.console.print(
                f"{stamp} [yellow]no checkpoint known[/yellow]: torchrun starts attempt "
                f"{event.attempt} with the same command; the script resumes only on its own "
                "(save through the hook to get EAGLEEYE_RESUME_FROM)"
            )
        elif not source and not flags:
            self.console.print(
                f"{stamp} [yellow]no checkpoint known[/yellow]: attempt {event.attempt} "
                "starts over unless the script resumes on its own (pass its resume flags "
                "with --resume-args, or save through the hook)"
            )

    def run_started(self, item: RunStarted) -> None:
        self.console.print(
            escape(
                f"run {item.run_dir.name}: store {item.run_dir / 'run.db'}; rank output in "
                f"{item.logs}/attempt-N/rank-R.log"
            )
        )

    def unfired(self, item: UnfiredFaults) -> None:
        for spec in item.specs:
            self.console.print(
                f"[yellow]fault {spec} never fired[/yellow] (its rank never reached step "
                f"{spec.step}, or its attempt {spec.attempt} never ran)"
                if spec.time is None
                else f"[yellow]fault {spec} never fired[/yellow] (its attempt ended first)"
            )


def _signal_name(exit_code: int) -> str:
    """`` (SIGKILL)`` for an exit code of -9: the signal that ended the process."""
    if exit_code >= 0:
        return ""
    try:
        return f" ({signal.Signals(-exit_code).name})"
    except ValueError:
        return ""
