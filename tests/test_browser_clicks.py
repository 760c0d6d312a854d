"""Charts you can click into, in a real Chromium: a click on a bar of the HLO explorer's kernel
chart lists the kernels of that kind and opens one, with the model lines behind it."""

from __future__ import annotations

import os
import re
import signal

import pytest
from conftest import smoke_env
from test_browser import CHROME_ARGS, CHROMIUM, _serve

playwright = pytest.importorskip("playwright.sync_api")
pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="no chromium installed")]

TOOLTIP = "#vg-tooltip-element"


def _shown(page, pattern: str, timeout_ms: int) -> None:
    """Wait for text matching `pattern` anywhere on the page, inside marimo's web components
    too (Playwright's text locators pierce their shadow DOM; ``innerText`` does not)."""
    page.get_by_text(re.compile(pattern)).first.wait_for(timeout=timeout_ms)


def _bar_at(page, canvas, pattern: str) -> tuple[float, float]:
    """Where on `canvas` the mark whose tooltip matches `pattern` is: hover down a column of
    the plot until Vega's tooltip says so (a canvas has no DOM of its marks to click)."""
    canvas.scroll_into_view_if_needed()
    box = canvas.bounding_box()
    for fx in (0.35, 0.45, 0.3):
        for y in range(int(box["y"]) + 5, int(box["y"] + box["height"]), 4):
            x = box["x"] + fx * box["width"]
            page.mouse.move(x, y)
            page.wait_for_timeout(30)
            tip = page.locator(TOOLTIP)
            if tip.count() and tip.is_visible() and re.search(pattern, tip.inner_text()):
                return x, y
    raise AssertionError(f"no mark with a tooltip matching {pattern!r}")


def test_clicking_a_kernel_bar_opens_its_kernels(tmp_path):
    proc, url = _serve(["run", "notebooks/hlo_explorer.py"], smoke_env(tmp_path))
    errors: list[str] = []
    try:
        with playwright.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROME_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 2400})
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(url)
            # before any click the table lists the fusions
            _shown(page, r"\d+ kernel\(s\) of kind fusion", 240_000)
            # and the page has finished opening (libtpu's compile of the step, at its end,
            # runs on open: a click meanwhile would wait behind it)
            _shown(page, r"compiled for v6e-1 .* by libtpu", 600_000)
            charts = page.locator(".vega-embed canvas")
            charts.nth(2).wait_for(state="visible", timeout=60_000)
            # the kernel chart: the right one of the two drawn side by side
            boxes = [(charts.nth(i).bounding_box(), i) for i in range(charts.count())]
            pair = [(b["x"], i) for b, i in boxes
                    if sum(abs(b["y"] - o["y"]) < 1 for o, _ in boxes) == 2]
            x, y = _bar_at(page, charts.nth(max(pair)[1]), r"opcode\s*dot")
            page.mouse.click(x, y)
            _shown(page, r"\d+ kernel\(s\) of kind dot: pick one", 60_000)
            # the table's first dot opens below, with the aten op behind it (HLO metadata)
            _shown(page, r"the table's first; pick another", 60_000)
            _shown(page, r"aten__(add)?mm", 60_000)
            # picking the table's second row opens that one instead
            # (rows of the one table with a selection column: marimo's "__select__" cells)
            row = page.locator("tbody tr:has(td[data-cell-id$='___select__'])").nth(1)
            name = row.locator("td[data-cell-id$='_name']").inner_text().strip()
            row.locator("td[data-cell-id$='___select__'] [role=checkbox]").click()
            # the detail's heading now names that kernel, and no longer the table's first
            heading = page.locator("h3", has_text=name)
            heading.first.wait_for(timeout=60_000)
            assert "the table's first" not in heading.first.inner_text()
            browser.close()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    assert not errors
