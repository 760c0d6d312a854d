"""Every notebook runs headless in smoke mode and exports without error outputs: the docs site is
built once (`tpu-workbench docs --smoke`), which runs every notebook, and every page is checked;
then a real Chromium opens the site with every non-localhost request blocked."""

from __future__ import annotations

import functools
import http.server
import json
import os
import shutil
import threading

import pandas as pd
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


def _site_page(site, stem: str) -> str:
    out, _ = site
    return (out / f"{stem}.html").read_text(encoding="utf-8")


def test_sharding_page_runs_every_strategy_its_model_takes(site):
    """The side-by-side section ran every strategy the page's model takes on its mesh, in
    smoke mode as in full mode (which crashed on `ep`, a strategy minGPT does not take, while
    smoke mode ran only dp and fsdp)."""
    from tpu_workbench import sharding

    (rows,) = [rows for label, rows in docs.exported_tables(_site_page(site, "sharding")).items()
               if label.startswith("every strategy")]
    mesh = tuple(sharding.MESHES["v6e-8"])
    wanted = sharding.model_strategies("mingpt", "tiny", mesh)
    assert [r["strategy"] for r in rows] == wanted
    assert wanted == ["dp", "fsdp", "tp", "dp_tp", "fsdp_tp"]
    # the stand-in that smoke mode runs takes exactly the same strategies
    assert sharding.model_strategies("mlp", "tiny", mesh) == wanted


@pytest.mark.parametrize("stem,label", [("quickstart", "per mode, on this machine"),
                                        ("eager_vs_compiled", "per mode, measured on this "
                                                              "machine")])
def test_xla_against_pytorch_sentence_agrees_with_its_table(site, stem, label):
    """The page's sentence on XLA against plain PyTorch says what its own table says."""
    from tpu_workbench import notebook

    page = _site_page(site, stem)
    table = pd.DataFrame(docs.exported_tables(page)[label])
    expected = notebook.xla_against_pytorch(table)
    assert expected, table  # both plain PyTorch and XLA ran, in smoke mode too
    claim = next(c for c in ("no speed-up", "x faster than", "about as fast") if c in expected)
    text = docs.exported_text(page)
    assert claim in text and expected.split("`")[1] in text, (expected, text[:3000])
    assert "XLA is no speed-up on a CPU;" not in text  # the old fixed sentence


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


def test_exported_problems_finds_ancestor_stopped_boxes_and_sections_waiting_for_a_click():
    stopped = ('<script>"__MARIMO_MOUNT_CONFIG__": Object.freeze({"session": {"cells": [{"id": '
               '"a", "outputs": [{"type": "error", "ename": "ancestor-stopped", "evalue": ""}], '
               '"console": []}]}})</script>')
    assert docs.exported_problems(stopped) == [
        "cell a: marimo's 'Ancestor stopped' box (a cell above it called mo.stop)"]
    import marimo as mo

    from tpu_workbench import notebook

    waiting = notebook.waiting_callout("Press **compile for a v6e-1** to compile it.").text
    nested = mo.vstack([mo.md("intro"), notebook.waiting_callout("Press **sweep**.")]).text
    exercise = mo.callout(mo.md("_Enter a number and press **check**._")).text
    heading = mo.md("## The same step, compiled for a v6e").text
    assert docs.exported_problems(_page({"b": waiting, "h": heading, "c": nested,
                                         "e": exercise})) == [
        "cell b: a section waits for a click instead of showing its answer: Press compile for "
        "a v6e-1 to compile it.",
        "cell c (section 'The same step, compiled for a v6e'): a section waits for a click "
        "instead of showing its answer: Press sweep ."]


def test_sections_wait_with_the_marked_callout(monkeypatch):
    """A section asked again without a click (its control changed, nothing stored) shows the
    marked callout, which the docs build refuses."""
    from tpu_workbench import notebook

    shown = []
    monkeypatch.setattr("marimo.output.replace", shown.append)
    sections = notebook.Sections()
    assert sections.reuse("s", clicked=False) is not None      # on open: measures
    assert sections.reuse("s", clicked=False) is None          # then waits
    assert docs.exported_problems(_page({"s": shown[0].text})) == [
        "cell s: a section waits for a click instead of showing its answer: Press run above "
        "to measure with these settings."]


def _page(outputs: dict[str, str]) -> str:
    """A page shaped like ``marimo export html``'s, one cell per {id: text/html output}."""
    cells = [{"id": cid, "outputs": [{"type": "data", "data": {"text/html": out}}],
              "console": []} for cid, out in outputs.items()]
    config = json.dumps({"session": {"cells": cells}})
    return f'<script>"__MARIMO_MOUNT_CONFIG__": Object.freeze({config})</script>'


def test_exported_problems_finds_failed_runs():
    import marimo as mo

    from tpu_workbench import WorkerCrashed, notebook

    failed = notebook.failed_run_callout("mlp/tiny/lazy", WorkerCrashed("worker died <signal 9>"))
    page = _page({
        "ok": mo.vstack([mo.md("**fine**"), mo.callout(mo.md("all good"), kind="success")]).text,
        "a": failed.text,                                        # on its own
        "b": mo.vstack([mo.md("summary"), mo.hstack([failed])]).text,   # nested twice
    })
    assert docs.exported_problems(page) == [
        "cell a: run failed: mlp/tiny/lazy: WorkerCrashed: worker died <signal 9>",
        "cell b: run failed: mlp/tiny/lazy: WorkerCrashed: worker died <signal 9>",
    ]


def test_an_empty_summary_is_a_failed_run():
    from tpu_workbench import Comparison, notebook

    shown = notebook.run_failures(Comparison(), pd.DataFrame())
    assert len(shown) == 1 and notebook.RUN_FAILED in json.dumps(shown[0].text)
    assert docs.exported_problems(_page({"s": shown[0].text})) == [
        "cell s: run failed: summary: no summary rows from 0 finished run(s)"]
    assert notebook.run_failures(Comparison(), pd.DataFrame({"mode": ["lazy"]})) == []


def test_index_summaries_are_rendered_prose():
    summary = docs.app_summary(ROOT / "notebooks" / "quickstart.py")
    assert summary.startswith("PyTorch reaches a TPU through <strong>XLA</strong>")
    assert '"""' not in summary and "return" not in summary and "**" not in summary
    for nb in NOTEBOOKS:
        text = docs.app_summary(nb)
        assert text and '"""' not in text and "return" not in text and "**" not in text, nb


def test_step_axes_tick_whole_steps():
    from tpu_workbench import charts

    steps = pd.DataFrame({"step": [0, 1, 2], "wall_ms": [9.0, 1.0, 1.1], "loss": [3, 2, 1.0],
                          "mode": "lazy"})
    compiles = pd.DataFrame({"mode": ["lazy"], "step": [0], "explanation": ["first"],
                             "cause": ["new graph"], "frame": ["train.py:1"]})
    for chart in (charts.step_times(steps), charts.loss_curves(steps),
                  charts.recompile_timeline(compiles, 3)):
        spec = chart.to_dict()
        axis = (spec.get("encoding") or spec["layer"][0]["encoding"])["x"]["axis"]
        assert axis["tickMinStep"] == 1 and axis["format"] == "d"


def test_memory_bars_say_which_parts_are_derived():
    from tpu_workbench import charts

    memory = pd.DataFrame({"device": [0, 1], "device_name": ["d0", "d1"],
                           "params_bytes": [100, 100], "grads_bytes": [100, 100],
                           "optimizer_bytes": [200, 200], "inputs_bytes": [8, 8]})
    spec = json.dumps(charts.memory_bars(memory).to_dict())
    assert "grads (derived: = params)" in spec and "optimizer (derived: 2 x params)" in spec
    assert "not measured" in spec


def test_display_helpers():
    from tpu_workbench import notebook

    frame = notebook.rounded(pd.DataFrame({"ms": [889.5176730000003, 0.000123456, float("nan")],
                                           "n": [1, 2, 3], "s": ["a", "b", "c"]}))
    assert frame["ms"].iloc[0] == 889.52 and frame["ms"].iloc[1] == 0.000123
    assert frame["n"].tolist() == [1, 2, 3] and frame["ms"].isna().iloc[2]
    assert [notebook.format_us(v) for v in (0, 0.42, 12.3, 4560, 1.2e6, 119e6, 3.66e8)] == [
        "0 µs", "0.42 µs", "12.3 µs", "4.56 ms", "1.2 s", "119 s", "6.1 min"]
    assert notebook.xla_flops_text({"xla_flops": 2.5e9}) == "counts **2.500 GFLOP**"
    failed = notebook.xla_flops_text({"xla_flops": None, "cost_error": "no jaxlib"})
    assert "failed" in failed and "no jaxlib" in failed and "0.000" not in failed
    assert notebook.host_peak_text({"measured_at": "2026-01-02T03:04:05"}) == \
        "fp32 matmul, measured at 2026-01-02 03:04:05"


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
            _wait_for_text(page, r"This CPU reaches [\d,]+ GFLOP/s", 60_000)
            chart = page.locator(".vega-embed canvas, .vega-embed svg").first
            chart.wait_for(state="visible", timeout=60_000)
            (ROOT / "results" / "screenshots").mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ROOT / "results" / "screenshots" / "site-offline.png"),
                            full_page=True)
            browser.close()
    finally:
        server.shutdown()
    assert blocked == [], blocked[:5]


def test_index_summaries_are_the_pages_own_words_with_math(site):
    """The index (the site's first page) showed raw `$T \\times T$` and "read … digits from 0
    to …": its summaries now come from the rendered pages, math drawn as MathML."""
    out, _ = site
    index = (out / "index.html").read_text(encoding="utf-8")
    assert "…" not in index and "$" not in index and "||(" not in index
    assert "read 6 digits from 0 to 2" in index                      # mingpt's values
    assert '<math xmlns="http://www.w3.org/1998/Math/MathML"' in index  # pallas' T x T


def test_generation_page_compiles_what_its_intro_says(site):
    """The intro said static_cache makes "two compilations per prompt length" beside a chart of
    3 prefills and 1 decode. Each strategy's programs counted on the page are the hand count
    of the rule the intro now states (generation.analysis.programs), for the page's prompts."""
    import importlib.util
    import re

    from tpu_workbench.generation import analysis

    spec = importlib.util.spec_from_file_location("nb_generation_site",
                                                  ROOT / "notebooks" / "generation.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # the setup cell only: its prompts, tokens and buckets
    text = docs.exported_text(_site_page(site, "generation"))
    counted = {s: int(a) + int(b) for s, a, b in re.findall(
        r"lazy (\w+) : (\d+) prefill and (\d+) decode programs? compiled", text)}
    assert set(counted) == set(analysis.STRATEGIES), text[:2000]
    for strategy, n in counted.items():
        assert n == analysis.programs(strategy, module.PROMPTS, module.NEW_TOKENS,
                                      module.BUCKETS), strategy
    assert "one prefill program per prompt length, and a single decode program" in text
