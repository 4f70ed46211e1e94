"""Screenshots of every dashboard page through headless Chromium (Playwright, no download).

Used by the browser test and to refresh the README's pictures:
``python -m dashboard.screenshots RUN_DIR OUT_DIR``.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

PAGES = {
    "overview": "",
    "ranks": "ranks",
    "training": "training",
    "findings": "findings",
    "actions": "actions",
    "checkpoints": "checkpoints",
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


def capture(url: str, out_dir: Path, browser_path: str) -> dict[str, str]:
    """Visits every page, saves ``<page>.png``; returns each page's title.

    Raises AssertionError naming the page if Streamlit shows an exception on it.
    """
    from playwright.sync_api import sync_playwright

    out_dir.mkdir(parents=True, exist_ok=True)
    titles = {}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=browser_path, args=FLAGS, headless=True)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        for name, path in PAGES.items():
            page.goto(f"{url}/{path}")
            page.wait_for_selector("h1", timeout=30_000)
            page.wait_for_load_state("networkidle")
            time.sleep(1.0)  # Vega draws its charts after the page settles
            if page.locator('[data-testid="stException"]').count():
                raise AssertionError(f"Streamlit shows an exception on the {name} page")
            titles[name] = page.locator("h1").first.inner_text()
            page.screenshot(path=str(out_dir / f"{name}.png"), full_page=True)
        browser.close()
    return titles


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
        for name, title in capture(url, args.out_dir, browser).items():
            print(f"{name}: {title}")


if __name__ == "__main__":
    main()
