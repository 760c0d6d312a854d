"""Every notebook runs headless in smoke mode and exports without error outputs: the docs site is
built once (`tpu-workbench docs --smoke`), which runs every notebook, and every page is checked;
then a real Chromium opens the site with every non-localhost request blocked."""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import threading

import pytest
from conftest import NOTEBOOKS, ROOT

from tpu_workbench import docs

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    mp = pytest.MonkeyPatch()
    mp.setenv("TPU_WORKBENCH_RESULTS", str(out.parent / "results"))
    results = docs.build_site(out, smoke=True, offline=True, jobs=2)
    mp.undo()
    return out, results


def test_every_notebook_is_found():
    assert {p.stem for p in NOTEBOOKS} >= {"quickstart"}
    assert [p.stem for p in docs.notebooks()][0] == "quickstart"


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_and_exports_without_errors(site, nb):
    out, results = site
    assert results[nb.name] == [], results[nb.name]
    page = (out / f"{nb.stem}.html").read_text(encoding="utf-8")
    assert docs.exported_problems(page) == []
    assert "./_marimo/" in page and docs.cdn_prefix() not in page  # served from the site


def test_index_links_every_page(site):
    out, _ = site
    index = (out / "index.html").read_text()
    for nb in NOTEBOOKS:
        assert f'href="{nb.stem}.html"' in index


def test_exported_problems_finds_errors():
    page = ('<script>"__MARIMO_MOUNT_CONFIG__": Object.freeze({"session": {"cells": [{"id": "a", '
            '"outputs": [{"type": "error", "ename": "ZeroDivisionError", "evalue": "x"}], '
            '"console": []}]}})</script>')
    assert docs.exported_problems(page) == ["cell a: ZeroDivisionError: x"]


@pytest.mark.browser
@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="no chromium installed")
def test_site_works_offline_in_a_real_browser(site):
    playwright = pytest.importorskip("playwright.sync_api")
    from test_browser import CHROME_ARGS, _wait_for_text

    out, _ = site
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(out))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    blocked: list[str] = []

    def route(r):
        if r.request.url.startswith(url):
            r.continue_()
        else:
            blocked.append(r.request.url)
            r.abort()

    try:
        with playwright.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROME_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 2400})
            page.route("**/*", route)
            page.goto(url)
            page.get_by_role("link", name="tpu-workbench quickstart").click()
            _wait_for_text(page, r"This host's CPU peaks at [\d,]+ GFLOP/s", 60_000)
            chart = page.locator(".vega-embed canvas, .vega-embed svg").first
            chart.wait_for(state="visible", timeout=60_000)
            (ROOT / "results" / "screenshots").mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ROOT / "results" / "screenshots" / "site-offline.png"),
                            full_page=True)
            browser.close()
    finally:
        server.shutdown()
    assert blocked == [], blocked[:5]
