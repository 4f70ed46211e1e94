"""The dashboard served for real and driven by headless Chromium: every page renders."""

from __future__ import annotations

from pathlib import Path

import pytest

from dashboard.screenshots import PAGES, capture, chromium, serve
from ft_runtime.ports import free_port

SHOTS = Path(__file__).resolve().parents[2] / "test-output" / "screenshots"
pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(300)]


def test_every_page_renders_in_chromium_without_a_streamlit_error(recorded_run) -> None:
    pytest.importorskip("playwright.sync_api")
    browser = chromium()
    if browser is None:
        pytest.skip("Debian's chromium is not installed (scripts/install-system-deps.sh)")
    for old in SHOTS.glob("*.png"):
        old.unlink()
    with serve(recorded_run, free_port()) as url:
        titles = capture(url, SHOTS, browser)
    assert {name: title.lower() for name, title in titles.items()} == {name: name for name in PAGES}
    for name in PAGES:
        assert (SHOTS / f"{name}.png").stat().st_size > 10_000, f"{name}.png looks blank"
