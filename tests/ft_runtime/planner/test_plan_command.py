from __future__ import annotations

from pathlib import Path

import pytest

from eagleeye.cli import main
from ft_runtime.planner.config import Strategy
from ft_runtime.planner.plan import PlanError, PlanRequest, make_plan
from ft_runtime.planner.report import text_table, write_html


def test_plan_command_prints_a_recommendation_and_writes_png_and_html(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    png, page = tmp_path / "plan.png", tmp_path / "plan.html"
    rc = main(
        [
            "plan",
            "--gpus",
            "100000",
            "--gpu-mtbf-hours",
            "50000",
            "--steps",
            "2000",
            "--spare-r",
            "5,7",
            "--replication-r",
            "3",
            "--plot",
            str(png),
            "--html",
            str(page),
            "--no-progress",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert "Recommended for 100,000 GPUs in 100 groups (system MTBF 30.0 min)" in out
    for name in ("ckpt", "ft-hsdp", "replication", "spare"):
        assert name in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "data:image/png;base64," in page.read_text()


def test_bad_plan_input_is_one_line_and_status_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--gpus", "1"]) == 2
    assert "need --gpus >= 2" in capsys.readouterr().err


def test_plan_picks_the_lowest_completed_time_to_train(tmp_path: Path) -> None:
    seen: list[str] = []
    plan = make_plan(
        PlanRequest(gpus=100_000, steps=1000, spare_r=(6,), replication_r=(2,)),
        progress=lambda label, f: seen.append(label),
    )
    assert {r.strategy for r in plan.rows} == set(Strategy)
    assert plan.best.ttt_ratio == min(r.ttt_ratio for r in plan.rows if r.completed)
    assert "spare r=6" in seen
    assert len(text_table(plan).splitlines()) == len(plan.rows) + 1
    assert write_html(plan, tmp_path / "p.html").exists()


def test_plan_request_rejects_impossible_layouts_by_skipping_them() -> None:
    plan = make_plan(PlanRequest(gpus=6000, n_groups=6, steps=200, spare_r=(2, 3)))
    # r = 3 has no distinct-difference layout for N = 6 (3·2 > 5): only r = 2 is simulated.
    assert [r.redundancy for r in plan.rows if r.strategy is Strategy.SPARE] == [2]
    with pytest.raises(PlanError, match="n_groups"):
        PlanRequest(gpus=10, n_groups=20).cluster()
