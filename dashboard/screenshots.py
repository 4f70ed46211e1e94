"""Screenshots of every dashboard page through headless Chromium (Playwright, no download).

Used by the browser test and to refresh the README's pictures:
``python -m dashboard.screenshots RUN_DIR OUT_DIR``.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PAGES = {
    "overview": "",
    "ranks": "ranks",
    "training": "training",
    "findings": "findings",
    "actions": "actions",
    "checkpoints": "checkpoints",
    "compare": "compare",
    "planner": "planner",
}
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium() -> str | None:
    """Debian's Chromium, if installed."""
    return shutil.which("chromium")


@contextmanager
def serve(run: Path, port: int, timeout_s: float = 60.0) -> Iterator[str]:
    """Runs `eagleeye dashboard` for ``run`` and yields its URL once it answers."""
    process = subprocess.Popen(
        [sys.executable, "-m", "eagleeye", "dashboard", "--run", str(run), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, process, timeout_s)
        yield url
    finally:
        process.terminate()
        process.wait(10)


def _wait_healthy(url: str, process: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            output = process.stdout.read().decode() if process.stdout else ""
            raise RuntimeError(f"dashboard exited: {output[-2000:]}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"dashboard did not answer at {url} within {timeout_s} s")


@dataclass(frozen=True, slots=True)
class PageView:
    """What a person reads on a page: its title, its text (metrics, banners, captions) and
    the texts of its charts (axis titles and tick labels, legends, mark labels), and the
    browser console's warnings while it drew."""

    title: str
    text: str
    chart_texts: tuple[str, ...]
    warnings: tuple[str, ...]


def capture(
    url: str, out_dir: Path, browser_path: str, pages: dict[str, str] | None = None
) -> dict[str, PageView]:
    """Visits every page, saves ``<page>.png``; returns what each page shows.

    Raises AssertionError naming the page if Streamlit shows an exception on it.
    """
    from playwright.sync_api import sync_playwright

    out_dir.mkdir(parents=True, exist_ok=True)
    views = {}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=browser_path, args=FLAGS, headless=True)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        console: list[str] = []
        page.on("console", lambda m: console.append(m.text) if m.type == "warning" else None)
        for name, path in (pages or PAGES).items():
            console.clear()
            page.goto(f"{url}/{path}")
            page.wait_for_selector("h1", timeout=30_000)
            page.wait_for_load_state("networkidle")
            main = page.locator('[data-testid="stMain"]')
            _settle(page, main)
            if page.locator('[data-testid="stException"]').count():
                raise AssertionError(f"Streamlit shows an exception on the {name} page")
            texts = page.locator(".vega-embed svg text").all_text_contents()
            views[name] = PageView(
                page.locator("h1").first.inner_text(),
                re.sub(r"\s+", " ", main.inner_text()),
                tuple(t.strip() for t in texts if t.strip()),
                tuple(console),
            )
            page.screenshot(path=str(out_dir / f"{name}.png"), full_page=True)
        browser.close()
    return views


def _settle(page: Any, main: Any, timeout_s: float = 60.0) -> None:
    """Waits until the page's script run is over (Streamlit marks its root element) and
    the page stopped changing: Vega draws its charts after the run."""
    done = '[data-testid="stApp"][data-test-script-state="notRunning"]'
    page.wait_for_selector(done, timeout=timeout_s * 1000)
    deadline = time.monotonic() + 10.0
    before = None
    while time.monotonic() < deadline:
        now = (main.inner_text(), page.locator(".vega-embed svg text").count())
        if now == before:
            return
        before = now
        time.sleep(0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description="Screenshot every dashboard page of a run.")
    parser.add_argument("run", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--port", type=int, default=8599)
    args = parser.parse_args()
    browser = chromium()
    if browser is None:
        sys.exit("chromium is not installed (Debian package chromium)")
    with serve(args.run, args.port) as url:
        for name, view in capture(url, args.out_dir, browser).items():
            print(f"{name}: {view.title}")


if __name__ == "__main__":
    main()
