"""Workshop exercises are fair: the answer is measured once in a fresh worker (so a warm
worker's cache cannot change it), nothing is judged before a submit, out-of-range input gets a
message, and checking an answer starts no worker."""

from __future__ import annotations

import builtins
import importlib.util
import sys

import pytest
from conftest import ROOT

import tpu_workbench as wb
from tpu_workbench.environment import backends
from tpu_workbench.runs.runner import WORKER_LOG_ENV

needs_xla = pytest.mark.skipif(not backends.have_torch_xla(), reason="needs torch_xla")


def _load(stem: str):
    """Import a notebook as a module: runs its setup cell only (no cell, no worker)."""
    name = f"nb_exercises_{stem}"
    spec = importlib.util.spec_from_file_location(name, ROOT / "notebooks" / f"{stem}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _inputs(module, needle: str) -> set[str]:
    """What the one cell of `module`'s app whose code contains `needle` reads from other cells
    (names of the setup cell, such as `mo` or an `@app.function`, left out)."""
    found = [c for c in module.app._cell_manager.cell_data() if needle in c.code]
    assert len(found) == 1, f"{len(found)} cells contain {needle!r}"
    return set(found[0].cell._cell.refs) - set(vars(module)) - set(dir(builtins))


@pytest.fixture
def worker_log(tmp_path, monkeypatch):
    log = tmp_path / "workers.log"
    monkeypatch.setenv(WORKER_LOG_ENV, str(log))
    return lambda: len(log.read_text().splitlines()) if log.exists() else 0


def test_eager_vs_compiled_check_reads_only_the_answer_and_starts_no_worker(worker_log):
    """The judge reads the submitted form alone: answering can rerun no cell that measures."""
    evc = _load("eager_vs_compiled")
    assert _inputs(evc, "exercise.judge(answer.value)") == {"answer"}
    assert "if answer.value is None" in _code(evc.app, "exercise.judge(answer.value)")
    from tpu_workbench.exercises import eager_vs_compiled

    assert eager_vs_compiled.judge("2")[0] == "success"
    assert worker_log() == 0


def test_the_last_batch_answer_is_what_xla_compiles(results):
    """The exercise's answer, 2, against a real loop: the batches of 32, then one of 8, then
    32 again, in one `compile` worker: two programs, and the repeat is a cache hit (the
    workbench's own runs, counted by torch_xla's counters)."""
    from tpu_workbench.exercises import eager_vs_compiled

    pool = wb.WorkerPool(max_workers=1)
    try:
        spec = wb.ExperimentSpec(model="mlp", preset="tiny", mode="compile", steps=2)
        first = wb.run(spec, pool=pool)
        last = wb.run(spec.replace(batch_size=8), pool=pool)
        again = wb.run(spec, pool=pool)  # the second epoch
    finally:
        pool.shutdown()
    compiled = [int(r.steps["compiles"].sum()) for r in (first, last, again)]
    assert compiled[0] >= 1 and compiled[1] >= 1 and compiled[2] == 0
    assert (compiled[0] > 0) + (compiled[1] > 0) == eager_vs_compiled.RIGHT


def test_quickstart_check_reads_the_layout_shown_and_starts_no_worker(worker_log):
    qs = _load("quickstart")
    # the submitted answer and what the page shows of the layout: no run, no run's control
    assert _inputs(qs, "exercise.judge(") == {
        "answer", "largest", "layout_mesh", "layout_strategy", "model"}
    assert "if answer.value is None" in _code(qs.app, "exercise.judge(")
    from tpu_workbench.exercises import quickstart

    kb = quickstart.held_kb("mlp", "fc1.weight", (2, 4), "fsdp")
    assert quickstart.judge(kb, kb, 8 * kb, "fsdp", 8)[0] == "success"
    assert worker_log() == 0


def _code(app, needle: str) -> str:
    return next(c.code for c in app._cell_manager.cell_data() if needle in c.code)


def test_your_model_exercise_reads_the_fit_table_and_starts_nothing(worker_log):
    from tpu_workbench import sharding

    module = _load("your_model")
    assert _inputs(module, "judge_smallest_slice(slice_answer") == {"fit", "slice_answer"}
    # Llama-3-8B, batch 32 x 2048 tokens: recomputation lets fsdp fit on a smaller slice
    order = ["v6e-8", "v6e-16", "v6e-32", "none"]

    def smallest(table) -> str:
        rows = table[(table.strategy == "fsdp") & table.fits]
        return min(rows.slice, key=order.index) if len(rows) else "none"

    kept = sharding.model_fit_table("hf:llama", "llama-3-8b", 32, 2048, recompute=True)
    full = sharding.model_fit_table("hf:llama", "llama-3-8b", 32, 2048, recompute=False)
    assert order.index(smallest(kept)) < order.index(smallest(full))
    for table in (kept, full):
        right = smallest(table)
        assert module.judge_smallest_slice(right, table)[0] == "success"
        wrong = next(s for s in order if s != right)
        assert module.judge_smallest_slice(wrong, table)[0] == "warn"
    assert worker_log() == 0


def test_generation_exercise_is_judged_on_submit_by_the_library_and_starts_nothing(
        worker_log):
    from tpu_workbench.exercises import generation as exercise

    module = _load("generation")
    assert _inputs(module, "exercise.judge(programs_answer.value") == {
        "comparison", "programs_answer"}
    assert "programs_answer.value is None" in _code(module.app,
                                                    "exercise.judge(programs_answer.value")
    # By hand, prompts 3, 12, 5, 12, 9 with 4 new tokens, buckets 8/16:
    # dynamic_cache: prefills for 3, 12, 5, 9 (4) + decode cache lengths p .. p+2 of each:
    #   {3,4,5} {12,13,14} {5,6,7} {9,10,11} = 11 distinct, so 15;
    # static_cache: 4 prefills + 1 decode = 5; bucketed: buckets 8 and 16 + 1 decode = 3.
    right = {"dynamic_cache": 15, "static_cache": 5, "bucketed": 3}
    kind, text = exercise.judge(right, {"static_cache": (4, 4)})
    assert kind == "success" and text.startswith("**Right**: 15, 5 and 3.")
    assert "compiled `static_cache` 4 (counted 4)" in text
    kind, text = exercise.judge({**right, "static_cache": 6.0})
    assert kind == "warn" and "not yet `static_cache`" in text
    assert not any(str(n) in text for n in right.values())  # hints, never the numbers
    for bad in ({**right, "bucketed": None}, {**right, "bucketed": 2.5},
                {**right, "bucketed": -1}, {**right, "bucketed": "three"}):
        kind, text = exercise.judge(bad)
        assert kind == "warn" and "Enter a whole number" in text and "`bucketed`" in text
    assert exercise.judge(None)[0] == "neutral"
    assert worker_log() == 0


@needs_xla
def test_generation_exercise_answer_is_what_xla_compiles(results):
    """The counting the judge uses is what torch_xla does: the question's requests, each
    strategy on a worker no other run's programs could have warmed."""
    from tpu_workbench.exercises import generation as exercise
    from tpu_workbench.generation import analysis

    specs = wb.generation_specs("mingpt", "tiny", ["lazy"], exercise.ASKED,
                                prompts=exercise.PROMPTS, new_tokens=exercise.NEW_TOKENS,
                                buckets=exercise.BUCKETS)
    got = wb.generate_many(specs)
    assert not got.errors, got.errors
    measured = {r.spec.decode: int(analysis.token_frame(r.records)["compiles"].sum())
                for r in got.results}
    assert measured == exercise.expected() == {"dynamic_cache": 15, "static_cache": 5,
                                               "bucketed": 3}
