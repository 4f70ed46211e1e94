"""The dashboard served for real and read in headless Chromium, as a person reads it: a live
hung run and a synthetic 512-rank, 1000-step run, every page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dashboard import synthetic
from dashboard.screenshots import PAGES, PageView, capture, chromium, serve
from eagleeye.summary import summarize
from ft_runtime.ports import free_port

SHOTS = Path(__file__).resolve().parents[2] / "test-output" / "screenshots"
pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(400)]
CLOCK = re.compile(r"^\d\d:\d\d(:\d\d)?$")  # a tick of the UTC time axis


@pytest.fixture(scope="module")
def browser() -> str:
    pytest.importorskip("playwright.sync_api")
    path = chromium()
    if path is None:
        pytest.skip("Debian's chromium is not installed (scripts/install-system-deps.sh)")
    return path


@pytest.fixture(scope="module")
def big_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("scale") / "r512"
    synthetic.build(run, 512, 1000)
    return run


def read_every_page(run: Path, browser: str, name: str) -> dict[str, PageView]:
    shots = SHOTS / name
    for old in shots.glob("*.png"):
        old.unlink()
    with serve(run, free_port()) as url:
        views = capture(url, shots, browser)
    assert {page: view.title.lower() for page, view in views.items()} == {p: p for p in PAGES}
    for page, view in views.items():
        assert (shots / f"{page}.png").stat().st_size > 10_000, f"{page}.png looks blank"
        assert not [w for w in view.warnings if "extent" in w.lower()], (page, view.warnings)
    return views


def assert_time_axes_read_as_clock_times(view: PageView) -> None:
    assert "time (UTC)" in view.chart_texts
    ticks = [t for t in view.chart_texts if CLOCK.match(t)]
    assert len(ticks) >= 2, view.chart_texts
    assert not [t for t in view.chart_texts if re.match(r"^\.\d{3}$", t)]  # ms of one second


def test_a_live_hung_run_reads_hung_with_its_culprit_on_every_page(browser, hung_run) -> None:
    views = read_every_page(hung_run, browser, "live")
    overview = views["overview"].text
    assert "Hung for" in overview
    assert "culprit rank 1" in overview
    assert "steps/s, last 30 s 0.00" in overview
    assert f"ETTR {summarize(str(hung_run)).ettr:.1%}" in overview
    assert "1 culprit" in views["overview"].chart_texts  # the grid labels the culprit's cell
    assert_time_axes_read_as_clock_times(views["training"])
    assert "finding: hang on rank 1" in views["training"].chart_texts


def test_a_512_rank_run_reads_on_every_page(browser, big_run) -> None:
    views = read_every_page(big_run, browser, "r512")
    summary = summarize(str(big_run))
    overview = views["overview"].text
    assert f"ETTR {summary.ettr:.1%}" in overview
    assert f"steps/s {summary.steps_per_s:.2f}" in overview
    assert "511 ok, 1 finding" in overview
    ranks = views["ranks"]
    slow = synthetic.straggler(512)
    host = f"node{slow // synthetic.PER_HOST:04d}"
    assert f"Worst outlier: rank {slow} on {host}" in ranks.text
    assert "512 ranks on 64 hosts, 2 ranks per row" in ranks.text
    assert_time_axes_read_as_clock_times(views["training"])
    assert_time_axes_read_as_clock_times(views["checkpoints"])
