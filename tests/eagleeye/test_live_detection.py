"""The live detectors on real runs: healthy, soft faults, hard faults, and their traces.

Three short runs of the reference workload on 4 ranks (2 virtual nodes) are recorded once:
a healthy one, one with a straggler, a NaN and a loss spike, and one with a killed rank
and, after the restart, a stopped one. The live findings, the demo summary's evidence, and
the labelled traces exported from the stores are checked against the injected faults.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from detectors.eval.harness import report
from detectors.eval.metrics import score_trace
from detectors.eval.runner import run_trace
from eagleeye.detection import replay_config
from eagleeye.launch import JobConfig, run_job
from eagleeye.recorded import recorded_trace
from eagleeye.store import RunReader
from eagleeye.summary import fault_findings, summarize
from ft_runtime.layout import JobLayout
from tests.workload_args import tiny_workload

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(400)]

SOFT = (
    "slow:rank=2@step=12,seconds=0.3,steps=8",
    "nan:rank=3@step=25",
    "loss_spike:rank=1@step=32,factor=20",
)
HARD = ("kill:rank=3@step=8", "stop:rank=1@step=16,attempt=1")


def _run(
    root: Path, name: str, steps: int, inject: tuple[str, ...] = (), remediate: bool = False
) -> Path:
    config = JobConfig(
        script="eagleeye.workload.train",
        module=True,
        script_args=tiny_workload(steps, 5),
        layout=JobLayout(nnodes=2, nproc_per_node=2),
        remediate=remediate,
        inject=inject,
        runs_dir=str(root),
        run_id=name,
    )
    result = run_job(config)
    assert result.succeeded
    return result.run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("live-runs")
    return {
        "healthy": _run(root, "healthy", 40),
        "soft": _run(root, "soft", 40, SOFT),
        "hard": _run(root, "hard", 30, HARD, remediate=True),
    }


def _findings(run: Path) -> list[tuple[str, int | None]]:
    with RunReader(run) as reader:
        found = reader.findings()
    return [
        (k, None if r != r else int(r)) for k, r in zip(found["kind"], found["rank"], strict=True)
    ]


def test_a_healthy_run_records_no_finding_and_no_action(runs: dict[str, Path]) -> None:
    with RunReader(runs["healthy"]) as reader:
        assert reader.findings().empty
        assert reader.actions().empty


def test_a_straggler_a_nan_and_a_loss_spike_each_give_their_finding(
    runs: dict[str, Path],
) -> None:
    found = _findings(runs["soft"])
    assert ("slow_rank", 2) in found
    assert ("loss_spike", 1) in found
    # Rank 3's loss went NaN; the all-reduce gave the others a NaN gradient norm, and rank 0
    # usually reports first. One finding names the root, the ranks it spread to are its
    # evidence.
    assert [f for f in found if f[0] == "nan"] == [("nan", 3)]
    with RunReader(runs["soft"]) as reader:
        table = reader.findings()
    (evidence,) = table.loc[table["kind"] == "nan", "evidence"]
    assert evidence["ranks_affected"] == 4.0
    assert sorted(evidence[f"affected_rank_{i}"] for i in range(3)) == [0.0, 1.0, 2.0]
    soft = {k for k, _ in found} - {"nan"}
    assert soft <= {"slow_rank", "loss_spike", "grad_spike"}, found
    with RunReader(runs["soft"]) as reader:
        actions = reader.actions()
    # Without a policy file only the NaN has a rule, and it only notifies.
    assert set(actions["kind"]) <= {"notify"}
    assert set(actions["finding_kind"]) <= {"nan"}


def test_a_kill_and_a_hang_are_each_answered_by_one_restart(runs: dict[str, Path]) -> None:
    found = _findings(runs["hard"])
    assert found[0] == ("process_exit", 3)
    assert ("hang", 1) in found
    with RunReader(runs["hard"]) as reader:
        actions = reader.actions()
    restarts = actions[(actions["kind"] == "restart") & (actions["status"] == "done")]
    # The fused collective-hang finding names the same rank and restarts nothing more.
    assert list(restarts["finding_kind"]) == ["process_exit", "hang"]


def test_the_summary_shows_each_faults_finding_with_its_evidence(
    runs: dict[str, Path],
) -> None:
    answers = {f.spec.split("@")[0]: f for f in fault_findings(summarize(str(runs["soft"])))}
    slow = answers["slow:rank=2"]
    assert (slow.finding, slow.subject) == ("slow_rank", "rank 2")
    assert slow.evidence["compute_ms"] > 5 * slow.evidence["compute_ms_peer_median"]
    assert slow.delay_steps is not None
    assert 0 <= slow.delay_steps <= 6
    spike = answers["loss_spike:rank=1"]
    assert (spike.finding, spike.subject) == ("loss_spike", "rank 1")
    assert spike.evidence["loss"] > 5 * spike.evidence["loss_baseline"]
    nan = answers["nan:rank=3"]
    assert (nan.finding, nan.subject) == ("nan", "rank 3")
    assert nan.evidence["loss"] != nan.evidence["loss"]  # NaN
    hard = {f.spec.split("@")[0]: f for f in fault_findings(summarize(str(runs["hard"])))}
    assert (hard["kill:rank=3"].finding, hard["kill:rank=3"].evidence["signal"]) == (
        "process_exit",
        9.0,
    )
    assert hard["stop:rank=1"].finding == "hang"


def test_traces_exported_from_the_runs_score_every_fault(runs: dict[str, Path]) -> None:
    faulty = [recorded_trace(runs[name]) for name in ("soft", "hard")]
    labels = {(w.kind, w.subject) for t in faulty for w in t.labels}
    assert labels == {
        ("slow_rank", "rank:2"),
        ("nan", "rank:3"),
        ("loss_spike", "rank:1"),
        ("process_exit", "rank:3"),
        ("hang", "rank:1"),
    }
    healthy = recorded_trace(runs["healthy"])
    assert healthy.labels == ()
    config = replay_config()
    result = report(
        [score_trace(t, run_trace(t, config)) for t in faulty],
        [score_trace(healthy, run_trace(healthy, config))],
    )
    assert {k: c["f1"] for k, c in result["classes"].items()} == {
        "slow_rank": 1.0,
        "nan": 1.0,
        "loss_spike": 1.0,
        "process_exit": 1.0,
        "hang": 1.0,
    }
    assert result["summary"]["localisation"] == 1.0
    assert run_trace(healthy, config) == []
