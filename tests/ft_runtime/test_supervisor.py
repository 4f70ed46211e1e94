"""The supervisor with real processes: launches, exits, cascades, restarts, budgets."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from ft_runtime.errors import LaunchError
from ft_runtime.layout import JobLayout
from ft_runtime.supervisor import JobSupervisor, LaunchSpec
from ft_runtime.testing import FakeLauncher
from ft_runtime.types import Action, ActionKind, OutcomeStatus, Phase

pytestmark = pytest.mark.integration

# The script each rank runs: behaviour per rank and attempt comes from its arguments.
SCRIPT = """
import os, sys, time
rank, attempt = os.environ["RANK"], os.environ["TORCHELASTIC_RESTART_COUNT"]
print("rank", rank, "world", os.environ["WORLD_SIZE"], "port", os.environ["MASTER_PORT"],
      "node", os.environ["EAGLEEYE_NODE"], flush=True)
plan = dict(arg.split("=") for arg in sys.argv[1:])  # e.g. 1@0=exit3 (rank@attempt)
action = plan.get(f"{rank}@{attempt}", "exit0")
here = os.path.dirname(os.path.abspath(__file__))
if action.startswith("sleep"):
    time.sleep(float(action[5:]))
    sys.exit(1)
if action.startswith("after"):  # fails once rank N of this attempt is on its way out
    while not os.path.exists(os.path.join(here, f"ending-{action[5:]}@{attempt}")):
        time.sleep(0.01)
    time.sleep(0.3)
    sys.exit(1)
time.sleep(0.2)
open(os.path.join(here, f"ending-{rank}@{attempt}"), "w").close()
sys.exit(int(action[4:]))
"""


def supervisor(tmp_path: Path, plan: list[str], world: int = 2, restarts: int = 2):
    script = tmp_path / "rank.py"
    script.write_text(SCRIPT)
    spec = LaunchSpec(
        [str(script), *plan],
        JobLayout(1, world, 1),
        "test",
        str(tmp_path / "logs"),
        stop_grace_s=1.0,
    )
    return JobSupervisor(spec, max_restarts=restarts)


def run_until(sup: JobSupervisor, done, timeout_s: float = 20.0) -> list:
    events = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        events += sup.poll()
        if done(events):
            return events
        time.sleep(0.05)
    raise AssertionError(f"timed out; events so far: {events}")


def test_all_ranks_exiting_cleanly_is_success_with_torchrun_environment(tmp_path) -> None:
    sup = supervisor(tmp_path, [])
    sup.start()
    events = run_until(sup, lambda ev: sup.finished)
    assert sup.phase is Phase.SUCCEEDED
    phases = [(e.subject, e.phase) for e in events]
    assert ("job", Phase.LAUNCH) in phases
    assert ("job", Phase.SUCCEEDED) in phases
    assert sum(1 for s, p in phases if p is Phase.EXITED) == 2
    log = (tmp_path / "logs" / "attempt-0" / "rank-1.log").read_text()
    assert log.startswith("rank 1 world 2 port ")
    assert "node node0" in log


def test_a_crash_cascade_has_one_first_failure_and_fails_the_job_without_recovery(tmp_path) -> None:
    sup = supervisor(tmp_path, ["0@0=exit3", "1@0=after0"], world=3)  # rank 2: exit 0
    sup.start()
    events = run_until(sup, lambda ev: sum(e.phase is Phase.EXITED for e in ev) == 3)
    exits = {e.subject: e.detail for e in events if e.phase is Phase.EXITED}
    assert exits["rank:0"]["exit_code"] == 3
    assert not exits["rank:0"]["collateral"]
    assert exits["rank:1"]["exit_code"] == 1
    assert exits["rank:1"]["collateral"]
    assert exits["rank:2"]["exit_code"] == 0
    sup.settle()
    assert sup.phase is Phase.FAILED


def test_restart_relaunches_every_rank_and_the_budget_ends_restart_loops(tmp_path) -> None:
    sup = supervisor(tmp_path, ["0@0=exit9", "0@1=exit9", "1@0=sleep30", "1@1=sleep30"], restarts=1)
    sup.start()
    run_until(sup, lambda ev: any(e.phase is Phase.EXITED for e in ev))
    first_pids = sup.pids()
    outcome = sup.execute(Action(ActionKind.RESTART, "job", "rank 0 died", "k1"))
    assert outcome.status is OutcomeStatus.DONE
    assert sup.attempt == 1
    assert set(sup.pids().values()).isdisjoint(first_pids.values())
    assert (
        sup.execute(Action(ActionKind.RESTART, "job", "again", "k1")).status
        is OutcomeStatus.SKIPPED
    )  # same key: idempotent
    run_until(sup, lambda ev: any(e.phase is Phase.EXITED and e.attempt == 1 for e in ev))
    outcome = sup.execute(Action(ActionKind.RESTART, "job", "rank 0 died again", "k2"))
    assert outcome.status is OutcomeStatus.FAILED
    assert "budget" in outcome.detail
    assert sup.phase is Phase.FAILED
    assert sup.alive() == 0


def test_stop_all_ends_a_stopped_rank(tmp_path) -> None:
    sup = supervisor(tmp_path, ["0@0=sleep30", "1@0=sleep30"])
    sup.start()
    time.sleep(0.5)
    os.kill(sup.pids()[0], signal.SIGSTOP)
    started = time.monotonic()
    sup.stop_all()
    assert sup.alive() == 0
    assert time.monotonic() - started < 5
    assert [e for e in sup.poll() if e.phase is Phase.EXITED] == []  # expected stops


ENV_SCRIPT = """
import json, os, sys
names = ["GROUP_WORLD_SIZE", "ROLE_NAME", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_ERROR_FILE",
         "TORCHELASTIC_USE_AGENT_STORE", "EAGLEEYE_RESUME_FROM", "LOCAL_WORLD_SIZE"]
print(json.dumps({"argv": sys.argv[1:], **{n: os.environ.get(n) for n in names}}))
sys.exit(3 if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0" else 0)
"""


def test_restarts_get_torchruns_variables_the_resume_flags_and_checkpoint(tmp_path) -> None:
    script = tmp_path / "env.py"
    script.write_text(ENV_SCRIPT)
    spec = LaunchSpec(
        [str(script), "--lr", "1"],
        JobLayout(1, 1, 1),
        "t",
        str(tmp_path / "logs"),
        resume_args=("--init_from=resume",),
    )
    sup = JobSupervisor(spec, max_restarts=2)
    sup.attempt_env = lambda attempt: {"EAGLEEYE_RESUME_FROM": "/ckpt/10"} if attempt else {}
    sup.start()
    run_until(sup, lambda ev: any(e.phase is Phase.EXITED for e in ev))
    assert sup.restart_job("test")
    events = run_until(sup, lambda ev: sup.finished)
    seen = [
        json.loads((tmp_path / "logs" / f"attempt-{a}" / "rank-0.log").read_text()) for a in (0, 1)
    ]
    assert seen[0]["argv"] == ["--lr", "1"]
    assert seen[1]["argv"] == ["--lr", "1", "--init_from=resume"]
    assert (seen[0]["EAGLEEYE_RESUME_FROM"], seen[1]["EAGLEEYE_RESUME_FROM"]) == (None, "/ckpt/10")
    assert seen[1]["GROUP_WORLD_SIZE"] == "1"
    assert seen[1]["ROLE_NAME"] == "default"
    assert seen[1]["TORCHELASTIC_MAX_RESTARTS"] == "2"
    assert seen[1]["TORCHELASTIC_USE_AGENT_STORE"] == "False"
    assert seen[1]["TORCHELASTIC_ERROR_FILE"].endswith("attempt-1/error-rank-0.json")
    launch = [e for e in events if e.subject == "job" and e.phase is Phase.LAUNCH]
    assert launch[0].detail["resume_from"] == "/ckpt/10"
    assert launch[0].detail["resume_args"] == "--init_from=resume"


def test_a_refused_restart_fails_the_job_with_its_reason(tmp_path) -> None:
    sup = supervisor(tmp_path, ["0@0=exit3"])
    sup.start()
    run_until(sup, lambda ev: any(e.phase is Phase.EXITED for e in ev))
    sup.stop_restarting("crash loop: the same failure twice")
    assert not sup.restart_job("again")
    events = sup.poll()
    assert sup.phase is Phase.FAILED
    assert events[-1].detail["reason"] == "crash loop: the same failure twice"


class _NoAgentFor(FakeLauncher):
    """A launcher that cannot start ``rank`` from attempt ``attempt`` on (its host gone)."""

    def __init__(self, rank: int, attempt: int) -> None:
        super().__init__()
        self.rank, self.attempt = rank, attempt

    def start(self, spec, generation, argv, env, log_path, nice=0) -> int:  # type: ignore[no-untyped-def]
        if spec.rank == self.rank and generation >= self.attempt:
            raise LaunchError(f"no agent holds node rank {spec.node_rank}")
        return super().start(spec, generation, argv, env, log_path, nice)


def test_a_restart_that_cannot_start_every_rank_ends_the_ones_it_started(tmp_path) -> None:
    launcher = _NoAgentFor(rank=1, attempt=1)
    launch = LaunchSpec(["train.py"], JobLayout(2, 1), "job", str(tmp_path))
    sup = JobSupervisor(launch, max_restarts=3, launcher=launcher)
    sup.start()
    launcher.exit(1, -9)
    sup.poll()
    action = Action(ActionKind.RESTART, "job", "rank 1 lost", key="restart/1")
    outcome = sup.execute(action)
    assert outcome.status is OutcomeStatus.FAILED
    assert "attempt 1 could not start: no agent holds node rank 1" in outcome.detail
    # attempt 1's rank 0 was started, then ended: nothing waits for rank 1 forever
    assert [(rank, gen) for rank, gen, _ in launcher.started] == [(0, 0), (1, 0), (0, 1)]
    assert not launcher.running(0)
    assert sup.phase is Phase.FAILED
    failed = [e for e in sup.poll() if e.subject == "job" and e.phase is Phase.FAILED]
    assert "could not start" in str(failed[-1].detail["reason"])
