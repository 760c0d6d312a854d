"""The eager_vs_compiled exercise in a real browser (`marimo edit`, Chromium): nothing is judged
before a submit, the right answer is accepted before and after the page warmed a worker on the
very graph the exercise asks about, and checking answers starts no worker."""

from __future__ import annotations

import os
import re
import sys

import pytest
from conftest import ROOT, smoke_env

from tpu_workbench.runs.runner import WORKER_LOG_ENV

playwright = pytest.importorskip("playwright.sync_api")
sys.path.insert(0, str(ROOT / "scripts"))
from screenshot_notebooks import CHROMIUM, browser, marimo_edit, wait_idle  # noqa: E402

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="no chromium installed")]


RIGHT, WRONG = re.compile(r"Right: 2"), re.compile(r"Not quite|another shape|second epoch")


def _shown(page, text):
    """Rendered outputs holding `text` (Playwright's CSS pierces the outputs' shadow roots,
    which `innerText` does not; the code editors are no output, so source text never counts)."""
    return page.locator(".output-area", has_text=text)


def _check(page, answer: str, expect) -> None:
    """Type `answer` in the exercise's box, press check, wait for `expect` in the verdict."""
    page.locator("input[placeholder='a whole number']").fill(answer)
    page.get_by_role("button", name="check", exact=True).click()
    _shown(page, expect).first.wait_for(timeout=60_000)


def test_eager_vs_compiled_exercise_in_marimo_edit(tmp_path):
    """Nothing is judged before a submit, answers are judged on submit, checking starts no
    worker, and a changed control asks for a click in words instead of measuring."""
    log = tmp_path / "workers.log"
    env = {**smoke_env(tmp_path), WORKER_LOG_ENV: str(log)}
    starts = lambda: len(log.read_text().splitlines()) if log.exists() else 0  # noqa: E731
    with marimo_edit(ROOT / "notebooks" / "eager_vs_compiled.py", env) as url, \
            browser() as b:
        page = b.new_page(viewport={"width": 1200, "height": 1600})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(url)
        wait_idle(page, 300)
        assert _shown(page, "nothing is judged before that").count() == 1  # the prompt...
        assert _shown(page, RIGHT).count() == _shown(page, WRONG).count() == 0  # no verdict
        assert _shown(page, "Ancestor stopped").count() == 0
        opened = starts()
        assert opened >= 1

        _check(page, "1", "another shape")
        _check(page, "6", "second epoch")
        _check(page, "2", RIGHT)
        assert starts() == opened  # three checks, no worker

        # A control change alone never measures: it asks for a click, in words.
        _shown(page, "fresh worker per mode").get_by_role("checkbox").click()
        _shown(page, "Press run above to measure these settings.").first.wait_for(
            timeout=60_000)
        wait_idle(page, 120, saw_busy=False)
        assert starts() == opened
        assert not errors


def test_pallas_exercise_and_a_refused_block_in_marimo_edit(tmp_path):
    """The pallas_kernels page in a real browser: the exercise judges only on submit (a slip
    is named, the right answer accepted); blocks the kernel refuses show why, with no
    "Ancestor stopped" box below; a new shape's check waits for its button, in words."""
    with marimo_edit(ROOT / "notebooks" / "pallas_kernels.py", smoke_env(tmp_path)) as url, \
            browser() as b:
        page = b.new_page(viewport={"width": 1200, "height": 1600})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(url)
        wait_idle(page, 300)
        assert _shown(page, "nothing is judged before that").count() == 1
        assert _shown(page, "480 KiB of VMEM per grid step").count() == 1
        box = page.locator("input[placeholder='KiB']")
        for answer, expect in (("448", "double-buffers"), ("768", "Right: 768 KiB.")):
            box.fill(answer)
            page.get_by_role("button", name="check", exact=True).click()
            _shown(page, expect).first.wait_for(timeout=60_000)

        # block_k 64 is no multiple of 128: refused, and nothing below breaks
        block_k = page.locator("select", has=page.locator("option", has_text="256"))
        block_k.select_option("64")
        _shown(page, "The kernel refuses these blocks").first.wait_for(timeout=60_000)
        wait_idle(page, 120, saw_busy=False)
        assert _shown(page, "Ancestor stopped").count() == 0  # (the code says it too)
        assert page.locator(".marimo-cell.has-error").count() == 0
        assert _shown(page, "KiB of VMEM per grid step").count() == 0  # waits for good blocks
        # a shape the kernel takes but nobody checked yet: the check waits for its button
        block_k.select_option("256")
        _shown(page, "Press check this shape").first.wait_for(timeout=60_000)
        assert _shown(page, "736 KiB of VMEM per grid step").count() == 1
    assert not errors, errors
