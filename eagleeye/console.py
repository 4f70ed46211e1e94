"""Live, one line per event, output of a running job on the terminal."""

from __future__ import annotations

import time

from rich.console import Console

from detectors.types import Finding, Severity
from eagleeye.controller import UnknownProgress
from eagleeye.stacks import HangStacks, top_frame
from ft_runtime.types import LifecycleEvent, OutcomeStatus, Phase
from remediation.remediator import Decision

_STYLE = {Severity.CRITICAL: "bold red", Severity.WARN: "yellow", Severity.INFO: "cyan"}
_STATES = {"T": "stopped", "D": "blocked", "R": "running", "S": "sleeping"}


class LiveLog:
    """Prints findings, decisions and job-level lifecycle events as they happen."""

    def __init__(self, console: Console | None = None, started: float | None = None) -> None:
        self.console = console or Console(stderr=True, highlight=False)
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
        elif isinstance(item, UnknownProgress):
            ranks = ", ".join(f"rank {r}" for r in item.ranks)
            self.console.print(
                f"{stamp} {ranks}: no step telemetry {item.after_s:g} s into attempt "
                f"{item.attempt}; progress unknown, not judged hung (a stopped or blocked "
                "process is still found from /proc)"
            )

    def _stacks(self, stamp: str, item: HangStacks) -> None:
        """Where each rank stands: its innermost frame (full stacks: RunReader.stacks())."""
        self.console.print(f"{stamp} stacks of every rank (RunReader(...).stacks()):")
        for stack in item.stacks:
            where = top_frame(stack.text) if stack.method != "none" else stack.text
            self.console.print(
                f"          rank {stack.rank} [{_STATES.get(stack.state, stack.state)}] "
                f"{stack.method}: {where}",
                markup=False,
            )

    def _event(self, stamp: str, event: LifecycleEvent) -> None:
        if event.subject == "job":
            self.console.print(
                f"{stamp} [bold]job[/bold] {event.phase.value} (attempt {event.attempt})"
            )
        elif event.phase is Phase.EXITED:
            code = event.detail.get("exit_code")
            note = " (collateral)" if event.detail.get("collateral") else ""
            if code != 0:
                self.console.print(f"{stamp} {event.subject} exited with {code}{note}")
