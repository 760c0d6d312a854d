"""The sharding and HLO explorer notebooks: which controls re-run which measurements.

Two kinds of check. The dataflow ones read marimo's graph of each notebook (no worker, no
browser): a section's measuring cell depends only on the controls it uses, and answering the
exercise reaches no cell that starts a worker. The browser one drives `marimo edit
notebooks/sharding.py` in Chromium (smoke mode) and counts the runs it makes: changing the
strategy and pressing its **run** measures that one strategy again and nothing else.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from conftest import ROOT, smoke_env

NOTEBOOKS = ROOT / "notebooks"


def _graph(stem: str):
    """marimo's dataflow graph of `notebooks/<stem>.py` (importing runs only the setup cell)."""
    from marimo._ast.app import InternalApp

    name = f"nb_graph_{stem}"
    spec = importlib.util.spec_from_file_location(name, NOTEBOOKS / f"{stem}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return InternalApp(module.app).graph


def _defining(graph, name: str) -> str:
    (cell_id,) = graph.definitions[name]
    return cell_id


def _reruns(graph, control: str) -> set[str]:
    """The cells marimo runs again when UI element `control` sends a new value: the cells
    that read it by name, and everything downstream of them (not the cell defining it)."""
    readers = {cid for cid, cell in graph.cells.items() if control in cell.refs}
    return readers.union(*(graph.descendants(cid) for cid in readers))


def _workers(graph) -> set[str]:
    """The cells that can start a worker: the ones that call the runner."""
    return {cid for cid, cell in graph.cells.items() if "wb.run(" in cell.code}


def test_sharding_sections_depend_only_on_their_controls():
    g = _graph("sharding")
    picked_run, every = _defining(g, "result"), _defining(g, "strategy_runs")
    assert _workers(g) == {picked_run, every}
    # A new strategy re-runs the picked run (and what is drawn from it), not the side by side.
    assert {picked_run, _defining(g, "collectives"), _defining(g, "memory")} <= _reruns(g, "pick")
    assert every not in _reruns(g, "pick")
    assert not _reruns(g, "pick") & ({every} | g.descendants(every))
    # A new model or mesh re-runs both; "run every strategy again" only the side by side.
    assert {picked_run, every} <= _reruns(g, "setup")
    assert every in _reruns(g, "again") and picked_run not in _reruns(g, "again")
    assert picked_run in _reruns(g, "remeasure") and every not in _reruns(g, "remeasure")


def test_sharding_exercise_starts_no_worker():
    g = _graph("sharding")
    assert _reruns(g, "answer") and not _reruns(g, "answer") & _workers(g)
    assert not _reruns(g, "tensor") & _workers(g)  # picking a tensor to draw is free too
    assert not _reruns(g, "grid") & _workers(g)  # and clicking a device of the grid


def test_hlo_explorer_sections_depend_only_on_their_controls():
    g = _graph("hlo_explorer")
    captured, diff = _defining(g, "step"), _defining(g, "module_diff")
    tpu = _defining(g, "tpu")
    assert {cid for cid, c in g.cells.items() if "SECTIONS." in c.code} == {captured, diff, tpu}
    assert captured in _reruns(g, "mode") and diff not in _reruns(g, "mode")
    assert {captured, diff, tpu} <= _reruns(g, "model")
    assert diff in _reruns(g, "run_diff") and captured not in _reruns(g, "run_diff")
    assert captured in _reruns(g, "run_capture") and diff not in _reruns(g, "run_capture")
    # libtpu's compile: its own button, never the capture's or the diff's
    assert tpu in _reruns(g, "tpu_button") and not {captured, diff} & _reruns(g, "tpu_button")
    assert tpu not in _reruns(g, "run_diff")
    for cheap in ("answer", "target", "pattern", "kernel_chart", "kernel_table"):
        assert _reruns(g, cheap) and not _reruns(g, cheap) & {captured, diff, tpu}, cheap


def test_charts_read_right():
    """The legend of slices sorts by number; the roofline's sizes are in GFLOP/MFLOP."""
    import pandas as pd

    from tpu_workbench import charts
    from tpu_workbench.charts.hlo import flop_unit
    from tpu_workbench.charts.sharding import slice_order

    rows = [((192, 256), "192:256, :"), ((64, 128), "64:128, :"), ((0, 64), "0:64, :"),
            ((128, 192), "128:192, :")]
    frame = pd.DataFrame({"index": [[list(a), [0, 8]] for a, _ in rows],
                          "index_label": [label for _, label in rows]})
    assert slice_order(frame) == ["0:64, :", "64:128, :", "128:192, :", "192:256, :"]
    assert slice_order(frame.drop(columns="index")) == slice_order(frame)
    assert flop_unit(3.2e9) == ("GFLOP", 1e9) and flop_unit(4.5e6) == ("MFLOP", 1e6)
    cost = pd.DataFrame({"name": ["a", "b"], "opcode": ["dot", "fusion"],
                         "flops": [2.0e9, 3.0e6], "bytes": [1e6, 1e6]})
    size = charts.roofline(cost, 1e12, 1e11).to_dict()["layer"][2]["encoding"]["size"]
    assert size["title"] == "GFLOP per op" and size["field"] == "flop_amount"


def test_xla_memory_parts_counts_each_allocation_once(tmp_path):
    """A memory-usage report in XLA's format (the largest allocations listed twice, as XLA
    does): arguments, returned buffers and temporaries add up to the report's total."""
    from tpu_workbench import sharding

    report = "\n".join([
        "Total bytes used: 7168 (7.0KiB)", "",
        "Allocations sorted by size:", "",
        "   4.0KiB( 57%);    3.0KiB; allocation 2: size 4.0KiB, preallocated-temp:",
        "   6.0KiB( 86%);    1.0KiB; allocation 0: size 2.0KiB, parameter 0, shape "
        "|f32[512]| at ShapeIndex {}, maybe-live-out:", "",
        "Allocations sorted by size with their values:",
        "allocation 2: size 4.0KiB, preallocated-temp:",
        "allocation 0: size 2.0KiB, parameter 0, shape |f32[512]| at ShapeIndex {}, "
        "maybe-live-out:",
        "allocation 1: size 1.0KiB, maybe-live-out:",
    ])
    hlo_dir = tmp_path / "hlo"
    hlo_dir.mkdir()
    (hlo_dir / "module_0001.mlp_train_step.7.cpu_after_optimizations-memory-usage-report.txt"
     ).write_text(report)
    parts = sharding.xla_memory_parts(hlo_dir)
    # By hand: parameter 0 is the argument (2 KiB), allocation 1 is returned (1 KiB), the
    # preallocated block is temporary (4 KiB); 2 + 1 + 4 KiB = the 7168 bytes of the total.
    assert parts == {"arguments_bytes": 2048.0, "outputs_bytes": 1024.0,
                     "temporaries_bytes": 4096.0, "total_bytes": 7168.0}
    assert sharding.xla_memory_parts(tmp_path / "nothing") is None


# -- in a real browser ---------------------------------------------------------------------

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
def _completed(results: Path) -> dict[str, dict]:
    """Spec of each completed run in `results`, by folder (a summary, not ``-failed``)."""
    if not results.is_dir():
        return {}
    return {d.name: json.loads((d / "spec.json").read_text()) for d in results.iterdir()
            if (d / "summary.json").is_file() and not d.name.endswith("-failed")}


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.is_file() else 0


@pytest.mark.browser
@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="no chromium installed")
def test_new_strategy_and_run_measures_only_that_strategy(tmp_path):
    pytest.importorskip("playwright.sync_api")
    spec = importlib.util.spec_from_file_location(
        "screenshot_notebooks", ROOT / "scripts" / "screenshot_notebooks.py")
    shots = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shots)

    env = smoke_env(tmp_path)
    results, log = Path(env["TPU_WORKBENCH_RESULTS"]), tmp_path / "workers.log"
    env["TPU_WORKBENCH_WORKER_LOG"] = str(log)
    with shots.marimo_edit(NOTEBOOKS / "sharding.py", env) as url, shots.browser() as b:
        page = b.new_page(viewport={"width": 1200, "height": 1600})
        page.goto(url)
        shots.wait_idle(page, timeout_s=300)
        assert page.evaluate(shots.JS_ERRORS) == 0
        opened = _completed(results)
        # On open: the picked strategy (dp_tp), then every strategy the model takes on the
        # page's mesh, side by side (smoke runs too: the same strategies as a full run).
        from tpu_workbench import sharding

        every = sharding.model_strategies("mingpt", "tiny", sharding.MESHES["v6e-8"])
        assert sorted(s["strategy"] for s in opened.values()) == sorted(["dp_tp", *every])
        workers_on_open = _lines(log)
        assert workers_on_open >= 1

        # The strategy form: the second form on the page (model and mesh come first).
        strategy_form = page.locator("marimo-form").nth(1)
        strategy_form.locator("select").select_option(label="fsdp")
        strategy_form.get_by_role("button", name="run").click()
        shots.wait_idle(page, timeout_s=300)
        assert page.evaluate(shots.JS_ERRORS) == 0
        now = _completed(results)
        new = [s for name, s in now.items() if name not in opened]
        assert [(s["strategy"], s["steps"]) for s in new] == [("fsdp", 3)], new
        assert _lines(log) - workers_on_open <= 1  # one fresh worker at most, for that run

        # A form sends nothing when submitted unchanged; "measure again" measures it again.
        page.get_by_role("button", name="measure again").click()
        shots.wait_idle(page, timeout_s=300)
        again = [s for name, s in _completed(results).items() if name not in now]
        assert [(s["strategy"], s["steps"]) for s in again] == [("fsdp", 3)], again


def test_the_exercises_rule_is_what_twice_the_batch_moves(results):
    """The sharding exercise's judge says which of dp's collectives grow with the batch; a real
    step at twice the batch moves what it says, to the byte."""
    import tpu_workbench as wb
    from tpu_workbench import sharding
    from tpu_workbench.exercises import sharding as exercise

    moved = {}
    for batch in (32, 64):
        run = wb.run(wb.ExperimentSpec(model="mingpt", preset="tiny", mode="compile", steps=1,
                                       mesh=(2, 4), strategy="dp", batch_size=batch,
                                       capture=("hlo",)))
        moved[batch] = sharding.collectives_frame(run, chip="v6e", mesh_shape=(2, 4))
    tokens = wb.batch_items("mingpt", "tiny")[1]
    assert tokens == 32 * 11
    assert exercise.mb_at_twice_the_batch(moved[32], tokens) == moved[64]["bytes"].sum() / 1e6
    assert moved[64]["bytes"].sum() < 2 * moved[32]["bytes"].sum()  # not everything doubles
