"""A real browser (Debian Chromium via Playwright) opens the quickstart as a user would."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import ROOT, smoke_env

playwright = pytest.importorskip("playwright.sync_api")
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="no chromium installed")]
CHROME_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SCREENSHOTS = ROOT / "results" / "screenshots"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(args: list[str], env: dict[str, str]):
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "marimo", "-y", *args, "--headless", "--no-sandbox", "--port",
         str(port)], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(url, timeout=1)
            return proc, url
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                os.killpg(proc.pid, signal.SIGTERM)
                raise RuntimeError("marimo server did not start") from None
            time.sleep(0.2)


def _wait_for_text(page, pattern: str, timeout_ms: int) -> None:
    """Wait until the page's rendered text matches `pattern` (across element boundaries)."""
    page.wait_for_function("p => new RegExp(p).test(document.body.innerText)", arg=pattern,
                           timeout=timeout_ms)


def test_quickstart_in_marimo_edit(tmp_path):
    """`marimo edit notebooks/quickstart.py`: outputs and an Altair chart render, no errors."""
    session = ROOT / "notebooks" / "__marimo__" / "session"
    shutil.rmtree(session, ignore_errors=True)  # old snapshots would show outputs before any run
    proc, url = _serve(["edit", "notebooks/quickstart.py", "--no-token"], smoke_env(tmp_path))
    errors: list[str] = []
    try:
        with playwright.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROME_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 2400})
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(url)
            # Text only a *run* produces: the code holds the f-string, not the numbers.
            _wait_for_text(page, r"This CPU reaches [\d,]+ GFLOP/s", 180_000)
            _wait_for_text(page, r"The fastest steady state on this machine is \w+, at [\d.]+ ms",
                           300_000)
            chart = page.locator(".vega-embed canvas, .vega-embed svg").first
            chart.wait_for(state="visible", timeout=60_000)
            box = chart.bounding_box()
            assert box and box["width"] > 100 and box["height"] > 100
            assert page.locator(".marimo-cell.has-error").count() == 0
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SCREENSHOTS / "quickstart.png"), full_page=True)
            browser.close()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    assert not errors, errors
    assert Path(SCREENSHOTS / "quickstart.png").stat().st_size > 10_000
